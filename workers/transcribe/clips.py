"""Several short recordings in one batched pass: the clip batcher behind ``transcribe_clips``.

Why: Whisper pads every input to a 30 s window, so a 5 s voice message costs
the encoder a whole window, and decoding one message at a time leaves most of
a GPU idle. (A CPU is busy either way: there a batch costs the CPU time of its
clips one by one, docs/BENCHMARKS.md "Voice bursts".) faster-whisper cannot batch
separate files (its issue #1264), but its ``BatchedInferencePipeline`` decodes
``clip_timestamps`` over one array as one batch, one window per clip. So the
clips are laid end to end in one array and each gets its own window.

Each clip's words are what the sequential engine gives for it alone, because
its window holds exactly the same samples:

* its speech is found and cut out as the sequential engine does it (Silero VAD
  with faster-whisper's default ``VadOptions``, then ``collect_chunks``), and
  its timestamps are mapped back the same way (``SpeechTimestampsMap``);
* the features of each window are computed from that clip's samples alone and
  padded to 30 s on their own, so batch-mates never change a clip's input
  (each window boundary is given as the exact float faster-whisper reads back
  as the sample index, and one silent frame separates clips so every window
  starts on its own frame, which is how a segment is traced to its clip);
* the same model, beam size and first temperature (0). The batched pipeline
  has no second chance, where the sequential engine decodes a window again at
  higher temperatures when its text looks like a failure (too repetitive, or
  too unlikely) and drops an unlikely window it judges silent. So a clip whose
  decode meets those same tests (faster-whisper's defaults: compression ratio
  above 2.4, average log-probability below -1) is not answered from the batch:
  it is left to the caller like a long one, and the sequential engine
  transcribes it on its own, retries and all.
  docs/BENCHMARKS.md "Voice bursts" measures the words against per-clip runs.

Per clip, not per batch: the language (the clip's hint if the model knows it,
else ``VOICY_WORKER_LANGUAGE``, else detected on that clip; clips of different
languages are decoded in separate passes), failures (media that cannot be
decoded fails its clip only; if a batched pass itself fails, e.g. out of GPU
memory, each of its clips is decoded again on its own), and the progress
callback (one that raises, a lost lease, ends its own clip only). A clip
longer than one window is not decoded here, and one whose decode the
sequential engine would retry or skip is not answered from here: the outcome
of either is ``None``, and the caller transcribes it on its own after posting
the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from faster_whisper import BatchedInferencePipeline, WhisperModel
from faster_whisper.audio import decode_audio
from faster_whisper.transcribe import get_compression_ratio
from faster_whisper.vad import SpeechTimestampsMap, VadOptions, collect_chunks, get_speech_timestamps

from workers.transcribe.failures import classify, require_audio_stream
from workers.transcribe.protocol import CLIP_WINDOW_S, Clip, ClipOutcome
from workers.transcribe.results import DURATION_DIGITS, Segment, Transcript
from workers.transcribe.seek import SAMPLE_RATE, exact_seconds, seek_of

log = logging.getLogger(__name__)

ENGLISH = "en"  # what an English-only model transcribes in, whatever it is asked
SEPARATOR_SAMPLES = 160  # one feature frame (10 ms at 16 kHz) of silence between clips in the array
# faster-whisper's defaults for ``WhisperModel.transcribe``, which the sequential engine uses: a window
# decoded more repetitively or less likely than this is decoded again at a higher temperature (or, if
# it also looks silent, skipped).
COMPRESSION_RATIO_THRESHOLD = 2.4
LOG_PROB_THRESHOLD = -1.0


@dataclass
class _Prepared:
    """A clip decoded and cut to its speech, waiting for its pass."""

    index: int
    clip: Clip
    speech: np.ndarray  # the speech-only samples, as the sequential engine would decode them
    timestamps: SpeechTimestampsMap  # speech time → time in the recording
    transcript: Transcript
    ended: Exception | None = None  # set when its callback raised: no more segments for it
    offset: int = field(default=0)  # where its window starts in the batch array (samples)
    decoded: list[str] = field(default_factory=list)  # its window's text, piece by piece, as decoded
    avg_logprob: float = 0.0  # of its window's decode (one per window)


def second_chance(prepared: _Prepared) -> bool:
    """True when the sequential engine would not keep this window's decode as it is: too unlikely (it
    decodes it again at a higher temperature, or skips it if it also looks silent) or too repetitive."""
    if not prepared.decoded:
        return False
    repetitive = get_compression_ratio("".join(prepared.decoded).strip()) > COMPRESSION_RATIO_THRESHOLD
    return repetitive or prepared.avg_logprob < LOG_PROB_THRESHOLD


class ClipBatcher:
    """Decodes short clips ``max_clips`` at a time with one loaded ``WhisperModel``."""

    def __init__(self, model: WhisperModel, *, beam_size: int, max_clips: int,
                 language_for: Callable[[str | None], str | None]) -> None:
        self._model = model
        self._pipeline = BatchedInferencePipeline(model)
        self._beam_size = beam_size
        self.max_clips = max_clips
        self._language_for = language_for
        self._rate = SAMPLE_RATE  # what decode_audio, VAD and the feature extractor all use
        self._fps = model.frames_per_second

    def transcribe(self, clips: Sequence[Clip]) -> list[ClipOutcome]:
        """One outcome per clip, in order (see the module docstring)."""
        outcomes: list[ClipOutcome] = [None] * len(clips)
        by_language: dict[str, list[_Prepared]] = {}
        for index, clip in enumerate(clips):
            try:
                prepared = self._prepare(index, clip)
            except Exception as exc:
                outcomes[index] = classify(exc)
                continue
            if prepared is None:
                continue  # longer than one window: the caller's
            if not len(prepared.speech):
                outcomes[index] = prepared.transcript  # no speech: an empty transcript, as alone
                continue
            by_language.setdefault(prepared.transcript.language or ENGLISH, []).append(prepared)
        for language, group in by_language.items():
            for start in range(0, len(group), self.max_clips):
                self._decode(group[start:start + self.max_clips], language)
        for group in by_language.values():
            for prepared in group:
                if prepared.ended is None and second_chance(prepared):
                    log.info("clip %d: its decode would be retried or skipped on its own; left to the caller",
                             prepared.index)
                    continue  # None: transcribed on its own, retries and all
                outcomes[prepared.index] = prepared.ended or prepared.transcript
        return outcomes

    def _prepare(self, index: int, clip: Clip) -> _Prepared | None:
        """Decode the clip and cut it to its speech; ``None`` when it is longer than one window."""
        require_audio_stream(clip.path)
        audio = decode_audio(str(clip.path), sampling_rate=self._rate)
        duration = len(audio) / self._rate
        if duration > CLIP_WINDOW_S:
            return None
        speech_chunks = get_speech_timestamps(audio, VadOptions())
        pieces, _ = collect_chunks(audio, speech_chunks)
        speech = np.concatenate(pieces) if speech_chunks else np.zeros(0, dtype=np.float32)
        language = self._language(clip.language, speech)
        transcript = Transcript(language=language, duration=round(duration, DURATION_DIGITS))
        return _Prepared(index, clip, speech, SpeechTimestampsMap(speech_chunks, self._rate), transcript)

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
        """One batched pass over ``group``; if the pass itself fails, each clip alone."""
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
                    prepared.decoded.clear()
                    self._decode([prepared], language)

    def _pass(self, group: list[_Prepared], language: str) -> None:
        """Lay the clips' speech end to end, decode one window per clip, route segments back."""
        pieces: list[np.ndarray] = []
        spans: list[dict[str, float]] = []
        by_frame: dict[int, _Prepared] = {}
        cursor = 0
        separator = np.zeros(SEPARATOR_SAMPLES, dtype=np.float32)
        for prepared in group:
            prepared.offset = cursor
            end = cursor + len(prepared.speech)
            spans.append({"start": exact_seconds(cursor), "end": exact_seconds(end)})
            by_frame[seek_of(cursor, self._fps)] = prepared
            pieces += [prepared.speech, separator]
            cursor = end + SEPARATOR_SAMPLES
        segments, _ = self._pipeline.transcribe(
            np.concatenate(pieces), language=language, clip_timestamps=spans, batch_size=len(group),
            beam_size=self._beam_size, without_timestamps=False, vad_filter=False)
        for segment in segments:
            prepared = by_frame[segment.seek]
            prepared.decoded.append(segment.text)
            prepared.avg_logprob = segment.avg_logprob
            text = segment.text.strip()
            if prepared.ended is not None or not text:
                continue
            offset_s = prepared.offset / self._rate
            start = prepared.timestamps.get_original_time(segment.start - offset_s)
            end = prepared.timestamps.get_original_time(segment.end - offset_s, is_end=True)
            prepared.transcript.segments.append(Segment(start=start, end=end, text=text))
            if prepared.clip.on_segment is not None:
                try:
                    prepared.clip.on_segment(prepared.transcript)
                except Exception as exc:  # e.g. its lease was lost: that clip ends, the others go on
                    prepared.ended = exc
