"""The batched faster-whisper engine (``faster-whisper-batched``): ``BatchedInferencePipeline``.

Selected with ``VOICY_WORKER_BATCH_SIZE`` > 0 (``workers.transcribe.settings``).
faster-whisper's batched mode cuts the audio at VAD pauses into chunks of at
most 30 s and decodes ``batch_size`` of them in one forward pass. On a GPU
that keeps the device busy and faster-whisper documents a several-fold
speed-up on long recordings (3.7× for large-v2); on this project's 2-core CPU
with tiny.en it measured 1.2–1.4× (docs/BENCHMARKS.md), bought with lost words
at chunk boundaries and more memory, so it stays off by default. No code here
is GPU-only.

What differs from the sequential engine, by faster-whisper's design: each
chunk is decoded without the previous chunk's text as a prompt
(``condition_on_previous_text`` is forced off), so words near a chunk
boundary can differ; within a chunk the parts are the same. We ask for
timestamps (``without_timestamps=False``), so a chunk is still split into
sentence-sized parts as the sequential engine splits a window, instead of one
part per 30 s. Progress streams as each batch is decoded: the generator yields
a batch's segments together.

Everything else (model loading, device, threads, language rule, error
mapping, the streaming loop) is the sequential engine's (:class:`WhisperEngine`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from faster_whisper import BatchedInferencePipeline
from faster_whisper.transcribe import Segment as WhisperSegment
from faster_whisper.transcribe import TranscriptionInfo

from workers.errors import ConfigError
from workers.transcribe.engine import SINGLE_PROCESS_POOL
from workers.transcribe.registry import BATCHED_ENGINE
from workers.transcribe.settings import EngineSettings
from workers.transcribe.whisper import WhisperEngine


class BatchedWhisperEngine(WhisperEngine):
    """The same model, decoded ``VOICY_WORKER_BATCH_SIZE`` chunks at a time."""

    name = BATCHED_ENGINE

    def __init__(self, settings: EngineSettings, pool_processes: int = SINGLE_PROCESS_POOL) -> None:
        if settings.batch_size < 1:  # EngineSettings refuses this combination; code could still build it
            raise ConfigError("VOICY_WORKER_BATCH_SIZE: must be at least 1 for the batched engine")
        super().__init__(settings, pool_processes)
        self.batch_size = settings.batch_size
        self._pipeline = BatchedInferencePipeline(self._model)

    def _segments(self, path: Path, language: str | None) -> tuple[Iterable[WhisperSegment], TranscriptionInfo]:
        return self._pipeline.transcribe(str(path), language=language, vad_filter=True, beam_size=self.beam_size,
                                         batch_size=self.batch_size, without_timestamps=False)
