"""Short recordings of separate jobs decoded together, one window each: the clip batcher behind ``transcribe_clips``."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from faster_whisper import BatchedInferencePipeline, WhisperModel
from faster_whisper.vad import SpeechTimestampsMap, VadOptions, collect_chunks, get_speech_timestamps

from workers.transcribe.audio import SAMPLE_RATE, decode
from workers.transcribe.failures import classify
from workers.transcribe.fallback import would_retry
from workers.transcribe.protocol import CLIP_WINDOW_S, Clip, ClipOutcome, MoreClips
from workers.transcribe.results import DURATION_DIGITS, Segment, Transcript
from workers.transcribe.seek import exact_seconds, seek_of

log = logging.getLogger(__name__)

ENGLISH = "en"  # what an English-only model transcribes in, whatever it is asked
SEPARATOR_SAMPLES = 160  # one feature frame (10 ms at 16 kHz) of silence between clips: each window starts on its own
# Clips decoded and cut to their speech at once, on threads (PyAV and onnxruntime's Silero VAD release
# the GIL), while a pass decodes the group before them. On a GPU a voice's decoding and VAD cost the
# host several times its share of a batched pass (reference/gpu.md), so one thread would be the
# bottleneck; a few keep up without taking the host's cores from other gpu processes.
PREPARE_THREADS = 4
# The batched pass decodes text tokens only. With timestamp tokens, CTranslate2's batched beam search
# grows with the square of the batch on a GPU (faster-whisper #985); without them it stays linear
# (docs/BENCHMARKS.md "Clip batches"). A clip's segment times come from its own speech instead.
WITHOUT_TIMESTAMPS = True


@dataclass
class _Prepared:
    """A clip decoded and cut to its speech (Silero VAD with faster-whisper's default ``VadOptions``, as
    the sequential engine cuts it), waiting for its pass."""

    index: int
    clip: Clip
    speech: np.ndarray  # the speech-only samples, as the sequential engine would decode them
    timestamps: SpeechTimestampsMap  # speech time → time in the recording
    transcript: Transcript
    ended: Exception | None = None  # set when its callback raised: no more segments for it
    decoded: str = ""  # its window's text as decoded, empty until its pass
    avg_logprob: float = 0.0  # of its window's decode

    @property
    def language(self) -> str:
        return self.transcript.language or ENGLISH

    def speech_span(self) -> tuple[float, float]:
        """Where its speech starts and ends in the recording (s): the one segment a clip's text gets,
        since a decode without timestamp tokens says nothing finer. A voice message is mostly one
        run of speech; its first and last words lie inside this span."""
        end = self.timestamps.get_original_time(len(self.speech) / SAMPLE_RATE, is_end=True)
        return self.timestamps.get_original_time(0.0), min(end, self.transcript.duration or end)  # map rounds up


def second_chance(prepared: _Prepared) -> bool:
    """True when the sequential engine would not keep this window's decode as it is
    (``workers.transcribe.fallback``): such a clip is left to the caller, whose sequential engine
    transcribes it alone, retries and all."""
    return would_retry(prepared.decoded, prepared.avg_logprob)


class _Run:
    """One ``transcribe`` call's clips, their preparation in flight, groups waiting for a pass, outcomes,
    and the look for more clips under way (at most one: ``more`` is never asked twice at once)."""

    def __init__(self, prepare: Callable[[int, Clip], _Prepared | None], pool: ThreadPoolExecutor) -> None:
        self.clips: list[Clip] = []
        self.outcomes: list[ClipOutcome] = []
        self.futures: deque[tuple[int, Future[_Prepared | None]]] = deque()
        self.pending: dict[str, list[_Prepared]] = {}
        self.looking: Future[bool] | None = None
        self._prepare = prepare
        self._pool = pool

    def submit(self, clips: Sequence[Clip]) -> bool:
        """Start preparing ``clips`` (appended to the run); True if there were any."""
        for clip in clips:
            index = len(self.clips)
            self.clips.append(clip)
            self.outcomes.append(None)
            self.futures.append((index, self._pool.submit(self._prepare, index, clip)))
        return bool(clips)

    def look(self, looker: ThreadPoolExecutor, more: MoreClips) -> None:
        """Ask ``more`` on the look thread and start preparing what it returns, unless a look is under
        way: a pass decodes meanwhile instead of waiting for the caller's claims and downloads."""
        if self.looking is None:
            self.looking = looker.submit(lambda: self.submit(more()))

    def looked(self) -> bool:
        """Wait for the look under way; True if it found clips. Its error is the caller's, as ``more``'s."""
        looking, self.looking = self.looking, None
        return looking is not None and looking.result()

    def settle(self, index: int, outcome: Transcript | Exception) -> None:
        """Record a clip's outcome and tell its ``on_done`` now; a raising callback is that clip's
        business, not the batch's."""
        self.outcomes[index] = outcome
        on_done = self.clips[index].on_done
        if on_done is None:
            return
        try:
            on_done(outcome)
        except Exception as exc:
            log.warning("clip %d: its on_done raised %s", index, type(exc).__name__)


class ClipBatcher:
    """Decodes short clips ``max_clips`` at a time with one loaded ``WhisperModel``.

    Why: Whisper pads every input to a 30 s window, so a 5 s voice message costs
    the encoder a whole window, and one message at a time leaves most of a GPU
    idle. faster-whisper cannot batch separate files (its issue #1264), but its
    ``BatchedInferencePipeline`` decodes ``clip_timestamps`` over one array as
    one batch, one window per clip: so the clips' speech is laid end to end.
    Each window's features are computed from its own clip and padded alone, so
    batch-mates never change a clip's input. Per clip, not per batch: the
    language, failures, the progress callback, and whether its decode is kept
    (:func:`second_chance`). A clip longer than one window, or one without a
    kept decode, has the outcome ``None``: the caller transcribes it alone.
    """

    def __init__(self, model: WhisperModel, *, beam_size: int, max_clips: int,
                 language_for: Callable[[str | None], str | None]) -> None:
        self._model = model
        self._pipeline = BatchedInferencePipeline(model)
        self._beam_size = beam_size
        self.max_clips = max_clips
        self._language_for = language_for
        self._fps = model.frames_per_second

    def transcribe(self, clips: Sequence[Clip], more: MoreClips | None = None) -> list[ClipOutcome]:
        """One outcome per clip, in order (``clips``, then ``more``'s). Clips are prepared on
        ``PREPARE_THREADS`` threads; a language's group is decoded as soon as it is full, while the
        threads prepare the clips after it. ``more`` is asked on a thread of its own while each pass
        decodes, and once more before a group that is not full, which its clips may fill."""
        with ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="clip-prepare") as pool, \
                ThreadPoolExecutor(1, thread_name_prefix="clip-look") as looker:  # shut first: a look submits to pool
            run = _Run(self._prepare, pool)
            run.submit(clips)
            while run.futures or run.pending or run.looking:
                if run.futures:
                    index, future = run.futures.popleft()
                    prepared = self._collect(index, future, run)
                    if prepared is None:
                        continue
                    group = run.pending.setdefault(prepared.language, [])
                    group.append(prepared)
                    if len(group) >= max(1, self.max_clips):
                        self._pass_over(run.pending.pop(prepared.language), run, looker, more)
                    continue
                found = run.looked() if run.looking else more is not None and run.submit(more())
                if found or not run.pending:
                    continue  # more clips arrived: they may fill a group before a part-full pass runs
                language = next(iter(run.pending))
                self._pass_over(run.pending.pop(language), run, looker, more)
        return run.outcomes

    def _pass_over(self, group: list[_Prepared], run: _Run, looker: ThreadPoolExecutor,
                   more: MoreClips | None) -> None:
        """Decode ``group`` while ``more`` is asked beside it, and settle each of its clips at once."""
        if more is not None:
            run.look(looker, more)
        began = time.monotonic()
        self._decode(group, group[0].language)
        log.info("decoded a pass of %d clips in %.2fs", len(group), time.monotonic() - began)
        for prepared in group:
            if prepared.ended is None and second_chance(prepared):
                log.info("clip %d: its decode would be retried or skipped on its own; left to the caller",
                         prepared.index)
                continue
            run.settle(prepared.index, prepared.ended or prepared.transcript)

    @staticmethod
    def _collect(index: int, future: Future[_Prepared | None], run: _Run) -> _Prepared | None:
        """A prepared clip that needs a pass; any other outcome is settled here."""
        try:
            prepared = future.result()
        except Exception as exc:  # undecodable, no audio stream, missing: that clip only
            run.settle(index, classify(exc))
            return None
        if prepared is not None and not len(prepared.speech):
            run.settle(index, prepared.transcript)  # no speech: an empty transcript, as alone
            return None
        return prepared  # None (longer than one window) stays the caller's

    def _prepare(self, index: int, clip: Clip) -> _Prepared | None:
        """Decode the clip and cut it to its speech; ``None`` when it is longer than one window."""
        audio = decode(clip.path)
        duration = len(audio) / SAMPLE_RATE
        if duration > CLIP_WINDOW_S:
            return None
        speech_chunks = get_speech_timestamps(audio, VadOptions())
        pieces, _ = collect_chunks(audio, speech_chunks)
        speech = np.concatenate(pieces) if speech_chunks else np.zeros(0, dtype=np.float32)
        language = self._language(clip.language, speech)
        transcript = Transcript(language=language, duration=round(duration, DURATION_DIGITS))
        return _Prepared(index, clip, speech, SpeechTimestampsMap(speech_chunks, SAMPLE_RATE), transcript)

    def _language(self, hint: str | None, speech: np.ndarray) -> str | None:
        """The clip's language as the sequential engine settles it: English for an English-only
        model whatever was asked; else the hint or the fallback (the language rule), else detected
        from the clip's speech (its first window)."""
        if not self._model.model.is_multilingual:
            return ENGLISH
        language = self._language_for(hint)
        if language is not None or not len(speech):
            return language
        return self._model.detect_language(audio=speech)[0]

    def _decode(self, group: list[_Prepared], language: str) -> None:
        """One batched pass over ``group``; if the pass itself fails (e.g. out of GPU memory), each clip
        alone."""
        try:
            self._pass(group, language)
        except Exception as exc:
            if len(group) == 1:
                group[0].ended = group[0].ended or classify(exc)
                return
            log.warning("a batched pass of %d clips failed (%s); decoding each on its own",
                        len(group), type(exc).__name__)
            for prepared in group:
                if prepared.ended is None:
                    prepared.transcript.segments.clear()
                    prepared.decoded = ""
                    self._decode([prepared], language)

    def _pass(self, group: list[_Prepared], language: str) -> None:
        """Lay the clips' speech end to end, decode one window per clip, route each window's text back
        by the frame it starts on (each boundary is the exact float faster-whisper reads back as the
        sample index)."""
        pieces: list[np.ndarray] = []
        spans: list[dict[str, float]] = []
        by_frame: dict[int, _Prepared] = {}
        cursor = 0
        separator = np.zeros(SEPARATOR_SAMPLES, dtype=np.float32)
        for prepared in group:
            end = cursor + len(prepared.speech)
            spans.append({"start": exact_seconds(cursor), "end": exact_seconds(end)})
            by_frame[seek_of(cursor, self._fps)] = prepared
            pieces += [prepared.speech, separator]
            cursor = end + SEPARATOR_SAMPLES
        segments, _ = self._pipeline.transcribe(
            np.concatenate(pieces), language=language, clip_timestamps=spans, batch_size=len(group),
            beam_size=self._beam_size, without_timestamps=WITHOUT_TIMESTAMPS, vad_filter=False)
        for segment in segments:  # one per window: no timestamp tokens split it
            prepared = by_frame[segment.seek]
            prepared.decoded += segment.text
            prepared.avg_logprob = segment.avg_logprob
            text = segment.text.strip()
            if prepared.ended is not None or not text:
                continue
            span_start, span_end = prepared.speech_span()
            prepared.transcript.segments.append(Segment(start=span_start, end=span_end, text=text))
            if prepared.clip.on_segment is not None:
                try:
                    prepared.clip.on_segment(prepared.transcript)
                except Exception as exc:  # e.g. its lease was lost: that clip ends, the others go on
                    prepared.ended = exc
