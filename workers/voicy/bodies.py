"""Voicy's ``progress``/``result`` body, built from an engine's transcript on Voicy's side."""

from __future__ import annotations

from workers.transcribe.results import EngineInfo, Transcript
from workers.voicy.models import EngineMetadata, Part, TranscriptBody


def engine_metadata(info: EngineInfo) -> EngineMetadata:
    """``metadata`` as Voicy stores it (``workerEngineMetadata``): model name, device, compute type."""
    return EngineMetadata(model=info.model, device=info.device, compute_type=info.compute_type)


def transcript_body(transcript: Transcript, engine_label: str, info: EngineInfo) -> TranscriptBody:
    """The body of a ``progress`` (partial transcript) or ``result`` (final) call (§1.9, §1.10).

    Built here, not in the engine, which knows nothing of Voicy's wire format: ``engine_label``
    is Voicy configuration (``VOICY_WORKER_ENGINE``, reference/voicy.md §6.7) so an operator can
    tell fleets apart. Absent values are omitted when dumped, never sent as ``null``.
    """
    return TranscriptBody(text=transcript.text,
                          parts=[Part(time_code=s.time_code, text=s.text) for s in transcript.segments],
                          language=transcript.language, engine=engine_label, duration=transcript.duration,
                          metadata=engine_metadata(info))
