"""The batched engine's decoding loop: VAD windows a batch at a time, a window that stops early resumed."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np
from faster_whisper import BatchedInferencePipeline
from faster_whisper.transcribe import Segment as WhisperSegment
from faster_whisper.vad import SpeechTimestampsMap, VadOptions, collect_chunks, get_speech_timestamps

from workers.transcribe.fallback import silent, would_retry

SAMPLE_RATE = 16000  # what faster-whisper decodes audio to
WINDOW_S = 24.0  # longest speech per window: Whisper's 30 s less room to see the last sentence end
VAD_MIN_SILENCE_MS = 160  # BatchedInferencePipeline's own setting: every short pause is a cut point
MIN_TAIL_S = 1.0  # a decode that stops this far before its window's end is resumed from where it stopped
MAX_SEEKS = 4  # resumptions per window at most (each must move forward): no loop on a stubborn window
# Windows of the first pass: the recording's first words reach progress after one window's decode,
# not after the whole first batch (with batch 8, every window of a recording up to ~3 min). Later
# passes take ``batch_size``. Costs one pass more on a recording of 2..batch_size+1 windows.
FIRST_PASS_WINDOWS = 1


@dataclass(order=True)
class Window:
    """A stretch of the speech array to decode, in samples; ``seeks``: how often it was resumed."""

    start: int
    end: int
    seeks: int = field(default=0, compare=False)


@dataclass
class Speech:
    """A recording's speech laid end to end, where it may be cut, and the way back to recording time."""

    samples: np.ndarray
    cuts: list[int]  # sample positions in ``samples`` between two VAD segments (a pause)
    timestamps: SpeechTimestampsMap | None  # None: no speech at all

    @classmethod
    def of(cls, audio: np.ndarray) -> Speech:
        options = VadOptions(max_speech_duration_s=WINDOW_S, min_silence_duration_ms=VAD_MIN_SILENCE_MS)
        chunks = get_speech_timestamps(audio, options, sampling_rate=SAMPLE_RATE)
        if not chunks:
            return cls(np.zeros(0, dtype=np.float32), [], None)
        pieces, _ = collect_chunks(audio, chunks, sampling_rate=SAMPLE_RATE)
        lengths = np.cumsum([c["end"] - c["start"] for c in chunks])
        return cls(np.concatenate(pieces), [int(n) for n in lengths[:-1]],
                   SpeechTimestampsMap(chunks, SAMPLE_RATE))


def plan_windows(total: int, cuts: list[int], max_samples: int) -> list[Window]:
    """``[0, total)`` cut at ``cuts`` into windows of at most ``max_samples``, each as long as it can be.

    A stretch with no cut within ``max_samples`` (VAD already splits speech
    longer than a window, so only a rounding case) is cut at the limit.
    """
    windows: list[Window] = []
    start, i = 0, 0
    while total - start > max_samples:
        end = start + max_samples
        while i < len(cuts) and cuts[i] <= start:
            i += 1
        best = None
        while i < len(cuts) and cuts[i] <= end:
            best = cuts[i]
            i += 1
        stop = best if best is not None else end
        windows.append(Window(start, stop))
        start = stop
    if total > start:
        windows.append(Window(start, total))
    return windows


def exact_seconds(sample: int) -> float:
    """A sample position as the float that faster-whisper's ``int(t * rate)`` reads back exactly."""
    t = sample / SAMPLE_RATE
    while int(t * SAMPLE_RATE) < sample:
        t = float(np.nextafter(t, np.inf))
    while int(t * SAMPLE_RATE) > sample:
        t = float(np.nextafter(t, -np.inf))
    return t


def seek_of(start: int, frames_per_second: int) -> int:
    """The ``seek`` faster-whisper stamps on every segment of the clip that starts at sample ``start``
    of a ``clip_timestamps`` pass: how a segment is traced back to its window."""
    return int(start / SAMPLE_RATE * frames_per_second)


def _silent(segment: WhisperSegment) -> bool:
    """The sequential engine's skip rule, applied to the window the segment was decoded from."""
    return silent(segment.no_speech_prob, segment.avg_logprob)


class SeekingBatchDecoder:
    """Decodes one recording's speech ``batch_size`` windows at a time, resuming windows that stop early.

    Why not faster-whisper's ``BatchedInferencePipeline.transcribe`` as it is: it
    cuts the speech into chunks of up to 30 s and decodes each chunk exactly
    once. Whisper was trained on 30 s windows whose last sentence is often cut
    off, so when a chunk's last sentence runs close to the window's end the model
    closes its output at that sentence's *start* timestamp and leaves the rest to
    "the next window". The sequential engine has a next window: it seeks to that
    timestamp and decodes from there. The batched pipeline has none, so the
    sentence is lost: on the 340 s bench recording 63 of 870 words, every one at
    the end of a chunk (docs/BENCHMARKS.md "Words").

    So this loop keeps the batching and adds the seek:

    * Silero VAD finds the speech (``VAD_MIN_SILENCE_MS``, faster-whisper's own
      batched setting, so every short pause is a place to cut), and the speech is
      laid end to end as the pipeline does (``collect_chunks``); timestamps are
      mapped back to the recording (``SpeechTimestampsMap``).
    * The speech is cut into windows of at most ``WINDOW_S`` (24 s) at those
      pauses, each as full as it can be (the fewest windows, the fewest encoder
      passes). 24 s and not Whisper's full 30: the model then sees the last
      sentence end in silence and closes it, so a window rarely needs resuming
      (on the 340 s bench recording, 30 s windows needed 8 resumptions, 24 s none,
      and cost more CPU in all: docs/BENCHMARKS.md).
    * Each round decodes up to ``batch_size`` of the earliest pending windows in
      one batched pass (``clip_timestamps`` over the speech array, one window per
      clip). A window whose last segment ends ``MIN_TAIL_S`` or more before the
      window does goes back into the queue from that timestamp (at most
      ``MAX_SEEKS`` times, and only if the decode moved forward), so its tail is
      decoded in the next round, batched with the windows that follow.
    * A window that Whisper itself calls silent (``workers.transcribe.fallback``:
      the sequential engine's rule and values) gives no segments, as in the
      sequential engine.
    * Segments are yielded in time order as soon as no earlier window is pending,
      so progress streams pass by pass; the first pass decodes only
      ``FIRST_PASS_WINDOWS`` window, so a recording of a few windows (all of them
      one pass at ``batch_size`` 8) still shows its first words while the rest
      is decoded.

    Decoding options are the sequential engine's (``workers.transcribe.whisper``):
    beam size, no previous-text prompt; the batched pass has no temperature fallback.

    With ``timestamps=False`` the passes decode text tokens only (on a GPU the
    timestamp path of a batched beam search grows with the square of the batch:
    docs/BENCHMARKS.md "GPU"). A window is then one segment, timed by its speech,
    and never resumed: without timestamp tokens the model does not hand a
    sentence to a next window. A window whose decode the sequential engine would
    not keep (``workers.transcribe.fallback.would_retry``) is decoded again alone
    by ``WhisperModel.transcribe``, temperature fallback and all.
    """

    def __init__(self, pipeline: BatchedInferencePipeline, *, batch_size: int, beam_size: int,
                 window_s: float = WINDOW_S, timestamps: bool = True) -> None:
        self.pipeline = pipeline
        self.timestamps = timestamps
        self._batch_size = batch_size
        self._beam_size = beam_size
        self._window = int(window_s * SAMPLE_RATE)
        self._frames_per_second = pipeline.model.frames_per_second
        self.passes = 0  # batched passes run (for the bench)
        self.resumed = 0  # windows resumed after stopping early (for the bench)
        self.retried = 0  # text-token windows decoded again alone (for the bench)

    def segments(self, speech: Speech, language: str) -> Iterator[WhisperSegment]:
        """The speech's segments in time order (recording time), streamed as rounds complete."""
        if speech.timestamps is None:
            return
        pending = plan_windows(len(speech.samples), speech.cuts, self._window)
        heapq.heapify(pending)
        done: list[tuple[int, int, WhisperSegment]] = []  # (start sample, order, segment), a heap
        order = 0
        size = min(FIRST_PASS_WINDOWS, self._batch_size)
        while pending:
            batch = [heapq.heappop(pending) for _ in range(min(size, len(pending)))]
            size = self._batch_size
            for window, found in zip(batch, self._decode(speech.samples, batch, language)):
                for segment in found:
                    heapq.heappush(done, (int(segment.start * SAMPLE_RATE), order, segment))
                    order += 1
                tail = self._tail(window, found)
                if tail is not None:
                    heapq.heappush(pending, tail)
            horizon = pending[0].start if pending else None
            while done and (horizon is None or done[0][0] < horizon):
                yield self._restored(heapq.heappop(done)[2], speech.timestamps)

    def _decode(self, samples: np.ndarray, batch: list[Window], language: str) -> list[list[WhisperSegment]]:
        """One batched pass; each window's segments (speech-array time), silent windows empty."""
        self.passes += 1
        spans = [{"start": exact_seconds(w.start), "end": exact_seconds(w.end)} for w in batch]
        seeks = {seek_of(w.start, self._frames_per_second): n for n, w in enumerate(batch)}
        found: list[list[WhisperSegment]] = [[] for _ in batch]
        segments, _ = self.pipeline.transcribe(
            samples, language=language, clip_timestamps=spans, batch_size=len(batch), beam_size=self._beam_size,
            without_timestamps=not self.timestamps, vad_filter=False)
        for segment in segments:
            found[seeks[segment.seek]].append(segment)
        if not self.timestamps:
            found = [self._text_window(samples, w, parts, language) for w, parts in zip(batch, found)]
        return [[] if parts and _silent(parts[0]) else parts for parts in found]

    def _text_window(self, samples: np.ndarray, window: Window, parts: list[WhisperSegment],
                     language: str) -> list[WhisperSegment]:
        """A text-token window's one segment, spanning its speech; decoded again alone when the
        sequential engine would not keep it."""
        if not parts:
            return parts
        text = "".join(p.text for p in parts)
        if would_retry(text, parts[0].avg_logprob):
            self.retried += 1
            return self._alone(samples, window, language)
        return [replace(parts[0], text=text, start=window.start / SAMPLE_RATE, end=window.end / SAMPLE_RATE)]

    def _alone(self, samples: np.ndarray, window: Window, language: str) -> list[WhisperSegment]:
        """One window through ``WhisperModel.transcribe`` (timestamps, temperature fallback, silence
        skip), its times moved to the speech array's."""
        offset = window.start / SAMPLE_RATE
        segments, _ = self.pipeline.model.transcribe(
            samples[window.start:window.end], language=language, beam_size=self._beam_size,
            condition_on_previous_text=False, vad_filter=False)
        return [replace(s, start=s.start + offset, end=s.end + offset) for s in segments]

    def _tail(self, window: Window, found: list[WhisperSegment]) -> Window | None:
        """What is left of ``window`` to decode again: from its last segment's end, if far enough."""
        if not self.timestamps or not found or window.seeks >= MAX_SEEKS:
            return None
        stopped = int(round(max(s.end for s in found) * SAMPLE_RATE))
        if stopped <= window.start or window.end - stopped < MIN_TAIL_S * SAMPLE_RATE:
            return None
        self.resumed += 1
        return Window(stopped, window.end, window.seeks + 1)

    @staticmethod
    def _restored(segment: WhisperSegment, timestamps: SpeechTimestampsMap) -> WhisperSegment:
        """The segment with recording times instead of speech-array times."""
        return replace(segment, start=timestamps.get_original_time(segment.start),
                       end=timestamps.get_original_time(segment.end, is_end=True))
