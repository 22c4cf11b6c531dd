"""faster-whisper, one model per process, streaming segments as they are decoded.

Why one per process: loading large-v3 takes seconds and gigabytes; CUDA
contexts do not survive fork, so the model is loaded lazily inside the pool
child on its first job (never at import, never in the parent). ``device=auto``
picks CUDA when CTranslate2 sees a GPU and the CPU otherwise; the GPU-only
path is just that choice plus the float16 default.

Empty transcripts are posted as a normal result with ``text: ""``: the real
client has done so since commit 8920982 and the server accepts it
(reference/voicy.md §8.1), and a retry would only produce silence again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workers.errors import PermanentJobError
from workers.voicy.models import EngineMetadata, Part, TranscriptBody
from workers.voicy.settings import VoicySettings

log = logging.getLogger(__name__)

ENGINE_NAME = "faster-whisper"
CUDA_COMPUTE_TYPE = "float16"
CPU_COMPUTE_TYPE = "int8"


def pick_device(requested: str) -> str:
    """``auto`` → ``cuda`` when a CUDA device is visible to CTranslate2, else ``cpu``."""
    if requested != "auto":
        return requested
    import ctranslate2

    return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"


def time_code(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:02d}:{secs:02d}"


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
        self.compute_type = settings.compute_type or (
            CUDA_COMPUTE_TYPE if self.device == "cuda" else CPU_COMPUTE_TYPE)
        self.model_name = settings.model
        self.default_language = settings.language
        self.beam_size = settings.beam_size
        local = Path(settings.model).is_dir()
        # A local path never reaches for the Hub; a name may be fetched only in production.
        self._model = WhisperModel(settings.model, device=self.device, compute_type=self.compute_type,
                                   local_files_only=local)
        log.info("loaded model %s on %s (%s)", Path(settings.model).name, self.device, self.compute_type)

    @property
    def metadata(self) -> EngineMetadata:
        return EngineMetadata(model=Path(self.model_name).name, device=self.device,
                              compute_type=self.compute_type)

    def transcribe(self, path: Path, language: str | None = None,
                   on_segment: Callable[[Transcript], None] | None = None) -> Transcript:
        """Decode ``path``; call ``on_segment`` with the growing transcript after each segment."""
        try:
            segments, info = self._model.transcribe(
                str(path), language=language or self.default_language, vad_filter=True,
                beam_size=self.beam_size)
        except Exception as exc:  # PyAV raises its own InvalidDataError family
            raise PermanentJobError(f"media could not be decoded: {type(exc).__name__}") from None
        transcript = Transcript(language=info.language, duration=round(info.duration, 3))
        for segment in segments:  # lazy: decoding happens while we iterate
            text = segment.text.strip()
            if text:
                transcript.parts.append(Part(time_code=time_code(segment.start), text=text))
                if on_segment is not None:
                    on_segment(transcript)
        return transcript

    def body(self, transcript: Transcript) -> TranscriptBody:
        return TranscriptBody(text=transcript.text, parts=list(transcript.parts),
                              language=transcript.language, engine=ENGINE_NAME,
                              duration=transcript.duration, metadata=self.metadata)

    progress_body = body
    result_body = body


_engine: Engine | None = None
_lock = threading.Lock()


def get_engine(settings: VoicySettings) -> Engine:
    """The process's engine, loaded on first use."""
    global _engine
    with _lock:
        if _engine is None:
            _engine = Engine(settings)
        return _engine
