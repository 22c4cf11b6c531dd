"""The batched faster-whisper engine (``faster-whisper-batched``, the default): windows decoded a batch at a time.

Selected unless ``VOICY_WORKER_BATCH_SIZE`` is 0 (``workers.transcribe.settings``).
A recording of one window (at most ``ONE_WINDOW_S``, most voice messages) has
nothing to batch: it is decoded exactly as the sequential engine decodes it
(faster-whisper's ``transcribe`` with the same options, temperature fallback
included), so its words are faster-whisper's own. A longer one has its speech
cut at VAD pauses into windows of at most 24 s, ``batch_size`` of them decoded
in one forward pass of faster-whisper's ``BatchedInferencePipeline``; a window
whose decode stops before its end is resumed from there in the next pass
(``workers.transcribe.seek``: without that, faster-whisper's batched mode drops
the last sentence of many windows). On this project's 2-core CPU with tiny.en
that costs the sequential engine's CPU seconds for the same words, and larger
batched operations keep both threads busier (docs/BENCHMARKS.md "Transcription
engines"); on a GPU faster-whisper documents a several-fold speed-up (3.7× for
large-v2). No code here is GPU-only.

What differs from the sequential engine on a long recording: window
boundaries (the sequential engine's follow its own timestamps; these are
fixed at pauses, then resumed), so a word at a boundary may be heard
differently, and no temperature fallback within a batch. Neither engine
prompts a window with the previous one's text. Progress streams as each batch
is decoded.

Everything else (model loading, device, threads, language rule, error
mapping, the streaming loop) is the sequential engine's (:class:`WhisperEngine`).
"""

from __future__ import annotations

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

ENGLISH = "en"  # what an English-only model transcribes in, whatever it is asked
ONE_WINDOW_S = 30.0  # Whisper's window: a recording this long or shorter is decoded in one


@dataclass(frozen=True)
class _Info:
    language: str
    duration: float


class BatchedWhisperEngine(WhisperEngine):
    """The same model, decoded ``VOICY_WORKER_BATCH_SIZE`` windows at a time."""

    name = BATCHED_ENGINE

    def __init__(self, settings: EngineSettings, pool_processes: int = SINGLE_PROCESS_POOL) -> None:
        if settings.windows_per_pass < 1:  # EngineSettings refuses this combination; code could still build it
            raise ConfigError("VOICY_WORKER_BATCH_SIZE: must be at least 1 for the batched engine")
        super().__init__(settings, pool_processes)
        self.batch_size = settings.windows_per_pass
        self.decoder = SeekingBatchDecoder(BatchedInferencePipeline(self._model), batch_size=self.batch_size,
                                           beam_size=self.beam_size)

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
