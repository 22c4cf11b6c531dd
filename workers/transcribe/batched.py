"""The batched faster-whisper engine (``faster-whisper-batched``): windows decoded a batch at a time.

Selected with ``VOICY_WORKER_BATCH_SIZE`` > 0 (``workers.transcribe.settings``).
The recording's speech is cut at VAD pauses into windows of at most 30 s and
``batch_size`` of them are decoded in one forward pass of faster-whisper's
``BatchedInferencePipeline``; a window whose decode stops before its end is
resumed from there in the next pass (``workers.transcribe.seek``: without
that, faster-whisper's batched mode drops the last sentence of many windows).
On this project's 2-core CPU with tiny.en it is faster than the sequential
engine on recordings longer than one window, with the same words
(docs/BENCHMARKS.md "Transcription engines"); on a GPU faster-whisper
documents a several-fold speed-up (3.7× for large-v2). No code here is GPU-only.

What differs from the sequential engine: window boundaries (the sequential
engine's windows follow its own timestamps; these are fixed at pauses, then
resumed), so a word at a boundary may be heard differently; no temperature
fallback. Both decode without a previous-text prompt. A recording of one
window (most voice messages) is decoded once either way. Progress streams as
each batch is decoded.

Everything else (model loading, device, threads, language rule, error
mapping, the streaming loop) is the sequential engine's (:class:`WhisperEngine`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from faster_whisper import BatchedInferencePipeline
from faster_whisper.audio import decode_audio
from faster_whisper.transcribe import Segment as WhisperSegment

from workers.errors import ConfigError
from workers.transcribe.engine import SINGLE_PROCESS_POOL
from workers.transcribe.registry import BATCHED_ENGINE
from workers.transcribe.seek import SAMPLE_RATE, SeekingBatchDecoder, Speech
from workers.transcribe.settings import EngineSettings
from workers.transcribe.whisper import DecodeInfo, WhisperEngine

ENGLISH = "en"  # what an English-only model transcribes in, whatever it is asked


@dataclass(frozen=True)
class _Info:
    language: str
    duration: float


class BatchedWhisperEngine(WhisperEngine):
    """The same model, decoded ``VOICY_WORKER_BATCH_SIZE`` windows at a time."""

    name = BATCHED_ENGINE

    def __init__(self, settings: EngineSettings, pool_processes: int = SINGLE_PROCESS_POOL) -> None:
        if settings.batch_size < 1:  # EngineSettings refuses this combination; code could still build it
            raise ConfigError("VOICY_WORKER_BATCH_SIZE: must be at least 1 for the batched engine")
        super().__init__(settings, pool_processes)
        self.batch_size = settings.batch_size
        self.decoder = SeekingBatchDecoder(BatchedInferencePipeline(self._model), batch_size=self.batch_size,
                                           beam_size=self.beam_size)

    def _segments(self, path: Path, language: str | None) -> tuple[Iterable[WhisperSegment], DecodeInfo]:
        audio = decode_audio(str(path), sampling_rate=SAMPLE_RATE)
        speech = Speech.of(audio)
        language = language or self._detect(speech)
        return self.decoder.segments(speech, language), _Info(language=language, duration=len(audio) / SAMPLE_RATE)

    def _detect(self, speech: Speech) -> str:
        """The language of the speech's first window, as the sequential engine detects it."""
        if not self._model.model.is_multilingual or not len(speech.samples):
            return ENGLISH
        return str(self._model.detect_language(audio=speech.samples)[0])
