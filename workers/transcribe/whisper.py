"""The sequential faster-whisper engine (registry name ``faster-whisper``), streaming segments."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from faster_whisper import WhisperModel
from faster_whisper.transcribe import Segment as WhisperSegment

from workers.errors import ConfigError
from workers.transcribe import host_threads
from workers.transcribe.audio import decode
from workers.transcribe.clips import ClipBatcher
from workers.transcribe.device import (
    default_compute_type,
    pick_device,
    resolve_cpu_threads,
    threads_reason,
    usable_cores,
)
from workers.transcribe.engine import SINGLE_PROCESS_POOL
from workers.transcribe.failures import classify
from workers.transcribe.languages import pick_language
from workers.transcribe.protocol import Clip, ClipOutcome, MoreClips, OnSegment
from workers.transcribe.registry import SEQUENTIAL_ENGINE
from workers.transcribe.results import DURATION_DIGITS, EngineInfo, Segment, Transcript
from workers.transcribe.settings import EngineSettings

log = logging.getLogger(__name__)

OFFLINE_ENVS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
TRUE_ENV_VALUES = ("1", "true", "yes")
# Whisper's previous-text prompt off (faster-whisper's default is on): with it, a window that
# starts on words the prompt already holds can skip ahead to where the prompt's text goes on
# (docs/BENCHMARKS.md "Words": 39 words lost in one window of the demo's long message).
CONDITION_ON_PREVIOUS_TEXT = False


class DecodeInfo(Protocol):
    """What the streaming loop reads from a decode's info (faster-whisper's ``TranscriptionInfo`` has it)."""

    @property
    def language(self) -> str: ...

    @property
    def duration(self) -> float: ...


def decode_options(beam_size: int) -> dict[str, object]:
    """The sequential engine's faster-whisper ``transcribe`` options, set here only (the bench's direct
    baseline passes the same). No previous-text prompt: see the module docstring."""
    return {"vad_filter": True, "beam_size": beam_size, "condition_on_previous_text": CONDITION_ON_PREVIOUS_TEXT}


def _offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in TRUE_ENV_VALUES for name in OFFLINE_ENVS)


class WhisperEngine:
    """A loaded ``WhisperModel`` and the options it was loaded with; decodes window after window.

    Model: ``VOICY_WORKER_MODEL`` is a name (``large-v3``) or a local CTranslate2
    directory. A directory is loaded with ``local_files_only=True`` (it must hold
    ``tokenizer.json`` or faster-whisper would fetch one); a name is too when
    ``HF_HUB_OFFLINE`` is set, so tests and air-gapped hosts never download.
    Device, compute type and CPU threads: ``workers.transcribe.device``.

    Language: the job's hint, else ``VOICY_WORKER_LANGUAGE``, else detected
    (Voicy's order, reference/voicy.md §6.7). A hint the model does not know
    (``english``, ``xx``) is skipped in that order rather than failing the job:
    faster-whisper's tokenizer raises ``ValueError`` for it on a multilingual
    model, and that would be reported retryable and fail the same way three times
    (``workers.transcribe.languages``). VAD is on (bundled Silero model, no
    download) so silence is skipped.

    Each 30 s window is decoded *without* the previous window's text as a prompt
    (``condition_on_previous_text=False``; faster-whisper's default is on). With
    the prompt, a window that begins with words the prompt already holds (speech
    that repeats itself, like the demo's long message of a story told three times)
    can make the decoder continue from where the prompt's text goes on and skip
    everything in between: 39 words of one window lost, reproduced at will on a
    slightly perturbed copy of that message and gone with the prompt off
    (docs/BENCHMARKS.md "Words"). Without it each window stands alone, as in the
    batched engine, which faster-whisper never prompts.

    Empty transcripts (silence, music) are a *normal result* with ``text: ""``:
    Voicy's client uploads them so, the server accepts
    ``""`` and answers "no text detected" (reference/voicy.md §8.1); a retry
    would only transcribe the same silence again. Errors: ``workers.transcribe.failures``.

    Subclasses change how segments are produced (:meth:`WhisperEngine._segments`),
    not the streaming loop, the language rule or the error mapping
    (``workers.transcribe.batched``). Both also batch short recordings across jobs
    (``transcribe_clips``, ``workers.transcribe.clips``) with the same loaded model.
    """

    name = SEQUENTIAL_ENGINE

    def __init__(self, settings: EngineSettings, pool_processes: int = SINGLE_PROCESS_POOL) -> None:
        self.device = pick_device(settings.device)
        self.compute_type = settings.compute_type or default_compute_type(self.device)
        cores = usable_cores()
        self.cpu_threads = resolve_cpu_threads(settings.cpu_threads, self.device, pool_processes, cores)
        self.model_name = settings.model
        self.default_language = settings.language
        self.beam_size = settings.beam_size
        local = Path(settings.model).expanduser().is_dir()
        try:
            self._model = WhisperModel(str(Path(settings.model).expanduser()) if local else settings.model,
                                       device=self.device, compute_type=self.compute_type,
                                       cpu_threads=self.cpu_threads, local_files_only=local or _offline())
        except Exception as exc:  # missing files, unsupported compute type, no CUDA runtime...
            raise ConfigError(f"VOICY_WORKER_MODEL={self.metadata.model} could not be loaded on "
                              f"{self.device} ({self.compute_type}): {type(exc).__name__}") from None
        self._clips = ClipBatcher(self._model, beam_size=self.beam_size,
                                  max_clips=settings.clip_batch_on(self.device),
                                  language_for=self.language_for)
        log.info("loaded model %s on %s (%s), cpu_threads=%d (%s), %s, engine %s, clip batches of %d",
                 self.metadata.model, self.device, self.compute_type, self.cpu_threads,
                 threads_reason(settings.cpu_threads, self.device, cores, pool_processes),
                 host_threads.applied().describe(self.device), self.name, max(1, self._clips.max_clips))

    @property
    def metadata(self) -> EngineInfo:
        """The model's *name* only: a local path would disclose the host's layout."""
        return EngineInfo(model=Path(self.model_name).name, device=self.device, compute_type=self.compute_type)

    def transcribe(self, path: Path, language: str | None = None,
                   on_segment: OnSegment | None = None) -> Transcript:
        """Decode ``path``; call ``on_segment`` with the growing transcript after each segment.

        faster-whisper decodes the audio, runs VAD and language detection when
        ``transcribe`` is called, and decodes text lazily while the segment
        generator is iterated (in 30-second windows), so the callback sees the
        transcript grow in bursts. An exception raised by the callback (e.g. a
        lost lease) stops decoding and propagates unchanged.
        """
        try:
            segments, info = self._segments(path, self.language_for(language))
            transcript = Transcript(language=info.language, duration=round(info.duration, DURATION_DIGITS))
            iterator = iter(segments)
        except Exception as exc:
            raise classify(exc) from None
        while True:
            try:
                segment = next(iterator)
            except StopIteration:
                break
            except Exception as exc:
                raise classify(exc) from None
            text = segment.text.strip()
            if text:
                transcript.segments.append(Segment(start=segment.start, end=segment.end, text=text))
                if on_segment is not None:
                    on_segment(transcript)
        return transcript

    @property
    def max_clips(self) -> int:
        """Short recordings per batched pass (``VOICY_WORKER_CLIP_BATCH_SIZE``)."""
        return self._clips.max_clips

    def transcribe_clips(self, clips: Sequence[Clip], more: MoreClips | None = None) -> list[ClipOutcome]:
        """Short recordings in batched passes, one outcome each (``workers.transcribe.clips``)."""
        return self._clips.transcribe(clips, more)

    def _segments(self, path: Path, language: str | None) -> tuple[Iterable[WhisperSegment], DecodeInfo]:
        """faster-whisper's lazy segment generator and its info, for one file (its samples decoded as
        faster-whisper decodes them, ``workers.transcribe.audio``)."""
        return self._model.transcribe(decode(path), language=language, **decode_options(self.beam_size))

    def language_for(self, hint: str | None) -> str | None:
        """The job's hint if this model knows it, else ``VOICY_WORKER_LANGUAGE``, else ``None`` (detect)."""
        return pick_language(hint, self.default_language, self._model.supported_languages)
