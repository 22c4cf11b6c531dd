"""The batched faster-whisper engine (``faster-whisper-batched``, the default): windows a batch at a time."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from faster_whisper import BatchedInferencePipeline
from faster_whisper.transcribe import Segment as WhisperSegment

from workers.errors import ConfigError
from workers.transcribe.audio import decode
from workers.transcribe.engine import SINGLE_PROCESS_POOL
from workers.transcribe.registry import BATCHED_ENGINE
from workers.transcribe.seek import SAMPLE_RATE, SeekingBatchDecoder, Speech
from workers.transcribe.settings import EngineSettings
from workers.transcribe.whisper import DecodeInfo, WhisperEngine, decode_options

log = logging.getLogger(__name__)

ENGLISH = "en"  # what an English-only model transcribes in, whatever it is asked
ONE_WINDOW_S = 30.0  # Whisper's window: a recording this long or shorter is decoded in one


@dataclass(frozen=True)
class _Info:
    language: str
    duration: float


class BatchedWhisperEngine(WhisperEngine):
    """The same model, decoded ``VOICY_WORKER_BATCH_SIZE`` windows at a time.

    A recording of one window (most voice messages) is decoded exactly as the sequential engine
    decodes it, temperature fallback included. A longer one is cut at VAD pauses into windows of at
    most 24 s, a batch of them per forward pass of ``BatchedInferencePipeline``; a window whose
    decode stops before its end is resumed from there in the next pass (``workers.transcribe.seek``),
    or the batched pipeline would drop the last sentence of many windows. What differs from the
    sequential engine on a long recording: window boundaries, and no temperature fallback in a batch.
    With ``VOICY_WORKER_TIMESTAMP_TOKENS`` off (unset on CUDA) the passes decode text tokens only, a
    part per window, and a window the sequential engine would decode again is decoded alone.
    """

    name = BATCHED_ENGINE

    def __init__(self, settings: EngineSettings, pool_processes: int = SINGLE_PROCESS_POOL) -> None:
        if settings.windows_per_pass < 1:  # EngineSettings refuses this combination; code could still build it
            raise ConfigError("VOICY_WORKER_BATCH_SIZE: must be at least 1 for the batched engine")
        super().__init__(settings, pool_processes)
        self.batch_size = settings.windows_per_pass
        self.decoder = SeekingBatchDecoder(BatchedInferencePipeline(self._model), batch_size=self.batch_size,
                                           beam_size=self.beam_size,
                                           timestamps=settings.timestamp_tokens_on(self.device))
        log.info("batched engine: %d windows per pass, %s", self.batch_size,
                 "timestamp tokens" if self.decoder.timestamps else "text tokens, a part per window")

    def _segments(self, path: Path, language: str | None) -> tuple[Iterable[WhisperSegment], DecodeInfo]:
        audio = decode(path, SAMPLE_RATE)
        if len(audio) <= ONE_WINDOW_S * SAMPLE_RATE:  # nothing to batch: the sequential engine's decode, as is
            return self._model.transcribe(audio, language=language, **decode_options(self.beam_size))
        speech = Speech.of(audio)
        language = language or self._detect(speech)
        return self.decoder.segments(speech, language), _Info(language=language, duration=len(audio) / SAMPLE_RATE)

    def _detect(self, speech: Speech) -> str:
        """The language of the speech's first window, as the sequential engine detects it."""
        if not self._model.model.is_multilingual or not len(speech.samples):
            return ENGLISH
        return str(self._model.detect_language(audio=speech.samples)[0])
