"""``transcribe_clips``: short recordings of separate jobs in one batched pass, each answered on its own.

The offline tiny.en model, real media (the committed fixtures and voices
spoken by them, devstack/fakes/synth_media.py, so every script is known).
The batched pass decodes text tokens only, the sequential engine with
timestamp tokens, so a word may be heard differently: the words of the batch
are bounded against the scripts and against each clip transcribed alone,
never compared for equality. Failures and a raising progress callback stay
with their own clip; a clip longer than one window, or whose decode the
sequential engine would retry at a higher temperature, is left to the caller;
the next clips are prepared while a pass decodes. ``python -m bench.clip_words``
measures the same on the 48-voice burst (docs/BENCHMARKS.md "Clip batches").
"""

from __future__ import annotations

import functools
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from bench.words import normalise, score
from devstack.fakes.synth_media import SpeechSynth, write_repeated_speech_ogg, write_video_only_mp4
from devstack.infra.stack import AUDIO_DIR, TINY_MODEL_DIR, audio_manifest
from tests.kit.voicy_stack import SUITE_CPU_THREADS
from workers.errors import PermanentJobError
from workers.transcribe.engine import create_engine
from workers.transcribe.probe import media_seconds
from workers.transcribe.protocol import CLIP_WINDOW_S, Clip, ClipBatchingEngine, OnSegment
from workers.transcribe.results import Transcript
from workers.transcribe.settings import EngineSettings

CLIPS_PER_PASS = 4
VOICES = 5  # spoken voices of 2-20 s, besides the committed short fixtures
VOICE_SEED = 15
MIN_VOICE_S, MAX_VOICE_S = 2.0, 20.0
REPEATED_VOICE_S = 18.0  # one sentence said about five times
# The batch's word errors against the scripts may exceed those of the clips alone by this much at
# most. A bound on the whole set, with room for either ISA's kernels (AVX2, AVX-512): on these clips
# the batch hears one phrase ("starts at ten") worse than alone, on the 48-voice burst it is better
# overall (docs/BENCHMARKS.md "Clip batches"). Lost sentences and swapped clips are caught per clip.
BATCH_WER_MARGIN = 0.10
SPAN_TOLERANCE_S = 1.0  # a segment of the clip alone starts and ends a frame or so from the speech's edges
LATE_CLIP_WAIT_S = 120.0  # only a bound for a broken implementation: the events settle in a second

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def engine() -> ClipBatchingEngine:
    built = create_engine(EngineSettings(model=TINY_MODEL_DIR, device="cpu", cpu_threads=SUITE_CPU_THREADS,
                                         clip_batch_size=CLIPS_PER_PASS))
    assert isinstance(built, ClipBatchingEngine) and built.max_clips == CLIPS_PER_PASS
    return built


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, str]:
    """Short recordings and what is said in each."""
    folder = tmp_path_factory.mktemp("voices")
    synth, rng = SpeechSynth(), random.Random(VOICE_SEED)
    said = {}
    for n in range(VOICES):
        path = folder / f"voice-{n}.ogg"
        said[path] = " ".join(synth.write_ogg(path, rng.uniform(MIN_VOICE_S, MAX_VOICE_S), rng)[1])
    for item in audio_manifest():
        if item["duration_s"] < CLIP_WINDOW_S:
            said[AUDIO_DIR / item["file"]] = item["text"]
    return said


@pytest.fixture(scope="module")
def short_clips(scripts: dict[Path, str]) -> list[Path]:
    return list(scripts)


Alone = Callable[[Path], Transcript]


@pytest.fixture(scope="module")
def alone(engine: ClipBatchingEngine) -> Alone:
    """What the engine gives for a recording transcribed on its own, each decoded once per module (a
    window of the model costs about a CPU-second), the same whichever test asks first."""
    return functools.cache(engine.transcribe)


def errors(script: str, text: str) -> int:
    found = score(script, text)
    return found.substitutions + found.deletions + found.insertions


def assert_close_words(one: Transcript, other: Transcript, label: object = "") -> None:
    """``other`` says what ``one`` says but for words heard differently: it skips no run of
    ``bench.words.LOST_RUN_WORDS`` words of ``one`` (a lost sentence, not a mishearing)."""
    assert normalise(other.text), (label, other.text)
    assert not score(one.text, other.text).lost_runs, (label, one.text, other.text)


def assert_spans_its_speech(one: Transcript, other: Transcript, label: object = "") -> None:
    """``other`` is one segment, from where the clip's speech starts to where it ends: a decode without
    timestamp tokens says nothing finer. That span holds every segment ``one`` (alone) has."""
    assert len(other.segments) == 1, (label, other.segments)
    (segment,) = other.segments
    assert other.duration is not None, (label, other)
    assert 0.0 <= segment.start < segment.end <= other.duration, (label, segment)
    assert segment.start <= one.segments[0].start + SPAN_TOLERANCE_S, (label, segment, one.segments)
    assert segment.end >= one.segments[-1].end - SPAN_TOLERANCE_S, (label, segment, one.segments)


def test_the_batch_hears_each_clip_about_as_well_as_alone(engine: ClipBatchingEngine, alone: Alone,
                                                           scripts: dict[Path, str]) -> None:
    paths = list(scripts)
    references = [alone(path) for path in paths]
    batched = engine.transcribe_clips([Clip(path) for path in paths])  # several passes of 4
    assert len(batched) == len(paths)
    for path, one, other in zip(paths, references, batched):
        assert isinstance(other, Transcript), (path.name, other)
        assert_close_words(one, other, path.name)
        assert not score(scripts[path], other.text).lost_runs, (path.name, scripts[path], other.text)
        assert (other.language, other.duration) == (one.language, one.duration) == ("en", other.duration)
        assert other.duration == pytest.approx(media_seconds(path), abs=0.05)
        assert_spans_its_speech(one, other, path.name)
    said = sum(len(normalise(text)) for text in scripts.values())
    alone_wer = sum(errors(scripts[p], t.text) for p, t in zip(paths, references)) / said
    transcripts = cast(list[Transcript], batched)  # each one asserted a Transcript above
    batch_wer = sum(errors(scripts[p], t.text) for p, t in zip(paths, transcripts)) / said
    assert batch_wer <= alone_wer + BATCH_WER_MARGIN, (batch_wer, alone_wer)


def test_a_clip_that_cannot_be_decoded_fails_alone(engine: ClipBatchingEngine, alone: Alone,
                                                   short_clips: list[Path], tmp_path: Path) -> None:
    video_only = write_video_only_mp4(tmp_path / "screen.mp4")
    clips = [short_clips[0], AUDIO_DIR / "undecodable.ogg", short_clips[1], video_only]
    outcomes = engine.transcribe_clips([Clip(path) for path in clips])
    assert isinstance(outcomes[1], PermanentJobError) and "could not be decoded" in str(outcomes[1])
    assert isinstance(outcomes[3], PermanentJobError) and "no audio stream" in str(outcomes[3])
    for index in (0, 2):
        outcome = outcomes[index]
        assert isinstance(outcome, Transcript)
        assert_close_words(alone(clips[index]), outcome, clips[index].name)


def test_a_recording_longer_than_one_window_is_left_to_the_caller(engine: ClipBatchingEngine,
                                                                  short_clips: list[Path]) -> None:
    story = AUDIO_DIR / "story.ogg"
    story_s = media_seconds(story)
    assert story_s is not None and story_s > CLIP_WINDOW_S
    outcomes = engine.transcribe_clips([Clip(short_clips[2]), Clip(story)])
    assert outcomes[1] is None
    assert isinstance(outcomes[0], Transcript) and outcomes[0].text


def test_a_decode_the_sequential_engine_would_retry_is_left_to_the_caller(
        engine: ClipBatchingEngine, alone: Alone, short_clips: list[Path], tmp_path: Path) -> None:
    """The batched pass has no temperature fallback; the sequential engine decodes a too repetitive
    window again. So such a clip is not answered from the batch: the caller transcribes it alone."""
    repeated = write_repeated_speech_ogg(tmp_path / "again.ogg", REPEATED_VOICE_S)
    outcomes = engine.transcribe_clips([Clip(short_clips[0]), Clip(repeated)])
    assert outcomes[1] is None
    assert isinstance(outcomes[0], Transcript)
    assert_close_words(alone(short_clips[0]), outcomes[0], short_clips[0].name)


def test_the_next_clips_are_prepared_while_a_pass_decodes(engine: ClipBatchingEngine, short_clips: list[Path],
                                                          tmp_path: Path) -> None:
    """A fifth clip arrives through a named pipe whose writer lets its bytes through only once the first
    pass has produced a segment: the pass must not wait for it, and the fifth clip's preparation must
    already have opened the pipe by then (it runs on a thread beside the pass)."""
    late = tmp_path / "late.ogg"
    os.mkfifo(late)
    source = short_clips[0]
    opened, first_segment = threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def writer() -> None:
        with late.open("wb") as pipe:  # returns once the reader has opened the pipe
            opened.set()
            seen["pass went first"] = first_segment.wait(LATE_CLIP_WAIT_S)
            pipe.write(source.read_bytes())

    def on_first_segment(_: Transcript) -> None:
        seen["opened during the pass"] = opened.wait(LATE_CLIP_WAIT_S)
        first_segment.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    clips = [Clip(short_clips[0], on_segment=on_first_segment), *map(Clip, short_clips[1:CLIPS_PER_PASS]),
             Clip(late)]
    outcomes = engine.transcribe_clips(clips)
    thread.join()
    assert seen == {"opened during the pass": True, "pass went first": True}
    assert all(isinstance(outcome, Transcript) for outcome in outcomes), outcomes
    transcripts = cast(list[Transcript], outcomes)  # all asserted Transcripts just above
    assert_close_words(transcripts[0], transcripts[-1], late.name)


def test_more_clips_are_asked_for_while_a_pass_decodes_and_each_outcome_comes_when_its_pass_ends(
        engine: ClipBatchingEngine, short_clips: list[Path]) -> None:
    """``more`` stands for the caller's claims and downloads: it is asked beside the pass, not in front
    of it. Here it answers only once the first pass has produced a segment (a ``more`` asked before
    the pass would wait out its bound); its clips are the second pass, and every clip's ``on_done``
    comes when its own pass ends, the first pass's before the second pass's first segment."""
    first_segment = threading.Event()
    events: list[str] = []

    def clip(path: Path, name: str) -> Clip:
        def on_segment(_: Transcript) -> None:
            events.append(f"segment {name}")
            first_segment.set()
        return Clip(path, on_segment=on_segment, on_done=lambda _: events.append(f"done {name}"))

    second = [clip(p, f"b{i}") for i, p in enumerate(short_clips[:CLIPS_PER_PASS])]
    asked: list[bool] = []

    def more() -> list[Clip]:
        if asked:
            return []
        asked.append(first_segment.wait(LATE_CLIP_WAIT_S))  # answered while the pass decoded
        return second

    first = [clip(p, f"a{i}") for i, p in enumerate(short_clips[:CLIPS_PER_PASS])]
    outcomes = engine.transcribe_clips(first, more)
    assert asked == [True], "more was asked in front of the pass"
    assert len(outcomes) == 2 * CLIPS_PER_PASS and all(isinstance(o, Transcript) for o in outcomes), outcomes
    done_a = max(events.index(f"done a{i}") for i in range(CLIPS_PER_PASS))
    first_b = min(events.index(f"segment b{i}") for i in range(CLIPS_PER_PASS))
    assert done_a < first_b, events
    transcripts = cast(list[Transcript], outcomes)  # all asserted Transcripts above
    assert [o.text for o in transcripts[:CLIPS_PER_PASS]] == [o.text for o in transcripts[CLIPS_PER_PASS:]]


class Gone(Exception):
    """What a progress callback raises when its job's lease was lost."""


def test_each_clip_streams_to_its_own_callback_and_a_raising_one_ends_only_its_clip(
        engine: ClipBatchingEngine, short_clips: list[Path]) -> None:
    seen: dict[int, list[str]] = {0: [], 1: [], 2: []}

    def callback(index: int) -> OnSegment:
        def on_segment(partial: Transcript) -> None:
            seen[index].append(partial.text)
            if index == 1:
                raise Gone("lease lost")
        return on_segment

    clips = short_clips[:3]
    outcomes = engine.transcribe_clips([Clip(path, on_segment=callback(i)) for i, path in enumerate(clips)])
    assert isinstance(outcomes[1], Gone)
    assert len(seen[1]) == 1  # no segment of it after the callback raised
    for index in (0, 2):
        final = outcomes[index]
        assert isinstance(final, Transcript)
        assert seen[index] and seen[index][-1] == final.text  # its own growing transcript, to the end
        assert all(final.text.startswith(text) for text in seen[index])
