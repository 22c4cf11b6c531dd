"""faster-whisper, one model per process, streaming segments as they are decoded.

Why one per process: loading large-v3 takes seconds and gigabytes, GPU memory
is not fully returned when a model is dropped (reference/ecosystem.md §4.2),
and CUDA contexts do not survive fork. So :func:`get_engine` loads the model
lazily inside the pool child on its first job — never at import, never in the
parent before fork — and keeps it for the life of the process.

Device: ``auto`` picks CUDA when CTranslate2 sees a GPU
(``ctranslate2.get_cuda_device_count() > 0``) and the CPU otherwise. The
GPU-only code is exactly that choice plus the ``float16`` default compute
type (CPU: ``int8``); everything else is the same on both.

Model: ``VOICY_WORKER_MODEL`` is a name (``large-v3``) or a local CTranslate2
directory. A directory is loaded with ``local_files_only=True`` (it must hold
``tokenizer.json`` or faster-whisper would fetch one); a name is too when
``HF_HUB_OFFLINE`` is set, so tests and air-gapped hosts never download.

Language: the job's hint, else ``VOICY_WORKER_LANGUAGE``, else detected.
VAD is on (bundled Silero model, no download) so silence is skipped.

Empty transcripts (silence, music) are a *normal result* with ``text: ""``:
Voicy's client has uploaded them so since commit 8920982, the server accepts
``""`` and answers "no text detected" (reference/voicy.md §8.1); a retry
would only transcribe the same silence again.

Errors: undecodable media (PyAV/FFmpeg errors) is permanent; a missing file,
running out of memory and anything unexpected are retryable.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workers.errors import ConfigError, PermanentJobError, RetryableJobError
from workers.voicy.models import ENGINE_NAME, EngineMetadata, Part, TranscriptBody
from workers.voicy.settings import VoicySettings

log = logging.getLogger(__name__)

CUDA_COMPUTE_TYPE = "float16"
CPU_COMPUTE_TYPE = "int8"
DURATION_DIGITS = 3  # seconds are reported to the millisecond
SECONDS_PER_MINUTE = 60
OFFLINE_ENVS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def pick_device(requested: str) -> str:
    """``auto`` → ``cuda`` when a CUDA device is visible to CTranslate2, else ``cpu``."""
    if requested != "auto":
        return requested
    import ctranslate2

    return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"


def default_compute_type(device: str) -> str:
    return CUDA_COMPUTE_TYPE if device == "cuda" else CPU_COMPUTE_TYPE


def time_code(seconds: float) -> str:
    """``MM:SS`` of a segment start (minutes keep growing past 99)."""
    minutes, secs = divmod(max(0, int(seconds)), SECONDS_PER_MINUTE)
    return f"{minutes:02d}:{secs:02d}"


def _offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes") for name in OFFLINE_ENVS)


@dataclass
class Transcript:
    """The transcript so far (partial while streaming, final at the end)."""

    parts: list[Part] = field(default_factory=list)
    language: str | None = None
    duration: float | None = None

    @property
    def text(self) -> str:
        return " ".join(p.text for p in self.parts if p.text).strip()


class Engine:
    """A loaded model and the options it was loaded with."""

    def __init__(self, settings: VoicySettings) -> None:
        from faster_whisper import WhisperModel

        self.device = pick_device(settings.device)
        self.compute_type = settings.compute_type or default_compute_type(self.device)
        self.model_name = settings.model
        self.default_language = settings.language
        self.beam_size = settings.beam_size
        local = Path(settings.model).expanduser().is_dir()
        try:
            self._model = WhisperModel(str(Path(settings.model).expanduser()) if local else settings.model,
                                       device=self.device, compute_type=self.compute_type,
                                       local_files_only=local or _offline())
        except Exception as exc:  # missing files, unsupported compute type, no CUDA runtime...
            raise ConfigError(f"VOICY_WORKER_MODEL={self.metadata.model} could not be loaded on "
                              f"{self.device} ({self.compute_type}): {type(exc).__name__}") from None
        log.info("loaded model %s on %s (%s)", self.metadata.model, self.device, self.compute_type)

    @property
    def metadata(self) -> EngineMetadata:
        """The model's *name* only: a local path would disclose the host's layout."""
        return EngineMetadata(model=Path(self.model_name).name, device=self.device,
                              compute_type=self.compute_type)

    def transcribe(self, path: Path, language: str | None = None,
                   on_segment: Callable[[Transcript], None] | None = None) -> Transcript:
        """Decode ``path``; call ``on_segment`` with the growing transcript after each segment.

        faster-whisper decodes the audio, runs VAD and language detection when
        ``transcribe`` is called, and decodes text lazily while the segment
        generator is iterated (in 30-second windows), so the callback sees the
        transcript grow in bursts. An exception raised by the callback (e.g. a
        lost lease) stops decoding and propagates unchanged.
        """
        try:
            segments, info = self._model.transcribe(
                str(path), language=language or self.default_language, vad_filter=True,
                beam_size=self.beam_size)
            transcript = Transcript(language=info.language, duration=round(info.duration, DURATION_DIGITS))
            iterator = iter(segments)
        except Exception as exc:
            raise _classify(exc) from None
        while True:
            try:
                segment = next(iterator)
            except StopIteration:
                break
            except Exception as exc:
                raise _classify(exc) from None
            text = segment.text.strip()
            if text:
                transcript.parts.append(Part(time_code=time_code(segment.start), text=text))
                if on_segment is not None:
                    on_segment(transcript)
        return transcript

    def body(self, transcript: Transcript) -> TranscriptBody:
        """The ``progress``/``result`` body; absent values are omitted when dumped."""
        return TranscriptBody(text=transcript.text, parts=list(transcript.parts),
                              language=transcript.language, engine=ENGINE_NAME,
                              duration=transcript.duration, metadata=self.metadata)

    progress_body = body
    result_body = body


def _classify(exc: Exception) -> Exception:
    """Map a decoding/inference error to our tree; messages carry no path (PyAV quotes it)."""
    name = type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return RetryableJobError(f"media file is missing: {name}")
    if _is_av_error(exc):
        return PermanentJobError(f"media could not be decoded: {name}")
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        return RetryableJobError(f"transcription ran out of memory: {name}")
    return RetryableJobError(f"transcription failed: {name}")


def _is_av_error(exc: BaseException) -> bool:
    import av

    return isinstance(exc, av.error.FFmpegError)


_engine: Engine | None = None
_lock = threading.Lock()


def get_engine(settings: VoicySettings) -> Engine:
    """The process's engine, loaded on first use (after fork) and kept."""
    global _engine
    with _lock:
        if _engine is None:
            _engine = Engine(settings)
        return _engine


def reset_engine() -> None:
    """Drop the cached engine (tests; a process that must switch models should restart instead)."""
    global _engine
    with _lock:
        _engine = None
