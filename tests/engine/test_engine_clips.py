"""``transcribe_clips``: short recordings of separate jobs in one batched pass, each as it would be alone.

The offline tiny.en model, real media (the committed fixtures and voices
spoken by them, devstack/fakes/synth_media.py). The words and the parts of
every clip must be exactly what the engine gives for it alone; failures and a
raising progress callback stay with their own clip; a clip longer than one
window, or whose decode the sequential engine would retry at a higher
temperature, is left to the caller. The WER of both sides against the known scripts
is measured by ``python -m bench voicy-burst`` (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from devstack.fakes.synth_media import SpeechSynth, write_repeated_speech_ogg, write_video_only_mp4
from devstack.infra.stack import AUDIO_DIR, TINY_MODEL_DIR, audio_manifest
from tests.kit.same_words import assert_same_words
from tests.kit.voicy_stack import SUITE_CPU_THREADS
from workers.errors import PermanentJobError
from workers.transcribe.engine import create_engine
from workers.transcribe.probe import media_seconds
from workers.transcribe.protocol import CLIP_WINDOW_S, Clip, ClipBatchingEngine
from workers.transcribe.results import Transcript
from workers.transcribe.settings import EngineSettings

CLIPS_PER_PASS = 4
VOICES = 5  # spoken voices of 2-20 s, besides the committed short fixtures
VOICE_SEED = 15
MIN_VOICE_S, MAX_VOICE_S = 2.0, 20.0
REPEATED_VOICE_S = 18.0  # one sentence said about five times

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def engine() -> ClipBatchingEngine:
    built = create_engine(EngineSettings(model=TINY_MODEL_DIR, device="cpu", cpu_threads=SUITE_CPU_THREADS,
                                         clip_batch_size=CLIPS_PER_PASS))
    assert isinstance(built, ClipBatchingEngine) and built.max_clips == CLIPS_PER_PASS
    return built


@pytest.fixture(scope="module")
def short_clips(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("voices")
    synth, rng = SpeechSynth(), random.Random(VOICE_SEED)
    voices = []
    for n in range(VOICES):
        path = folder / f"voice-{n}.ogg"
        synth.write_ogg(path, rng.uniform(MIN_VOICE_S, MAX_VOICE_S), rng)
        voices.append(path)
    fixtures = [AUDIO_DIR / m["file"] for m in audio_manifest() if m["duration_s"] < CLIP_WINDOW_S]
    return voices + fixtures


Alone = Callable[[Path], Transcript]


@pytest.fixture(scope="module")
def alone(engine: ClipBatchingEngine) -> Alone:
    """What the engine gives for a recording transcribed on its own, each decoded once per module (a
    window of the model costs about a CPU-second), the same whichever test asks first."""
    return functools.cache(engine.transcribe)


def test_each_clip_gets_the_words_and_parts_it_gets_alone(engine: ClipBatchingEngine, alone: Alone,
                                                          short_clips: list[Path]) -> None:
    references = [alone(path) for path in short_clips]
    batched = engine.transcribe_clips([Clip(path) for path in short_clips])  # several passes of 4
    assert len(batched) == len(short_clips)
    for path, one, other in zip(short_clips, references, batched):
        assert isinstance(other, Transcript), (path.name, other)
        assert_same_words(one, other, path.name)  # words and timing: punctuation varies with the CPU's kernels
        assert (other.language, other.duration) == (one.language, one.duration) == ("en", other.duration)
        assert other.duration == pytest.approx(media_seconds(path), abs=0.05)


def test_a_clip_that_cannot_be_decoded_fails_alone(engine: ClipBatchingEngine, alone: Alone,
                                                   short_clips: list[Path], tmp_path: Path) -> None:
    video_only = write_video_only_mp4(tmp_path / "screen.mp4")
    clips = [short_clips[0], AUDIO_DIR / "undecodable.ogg", short_clips[1], video_only]
    outcomes = engine.transcribe_clips([Clip(path) for path in clips])
    assert isinstance(outcomes[1], PermanentJobError) and "could not be decoded" in str(outcomes[1])
    assert isinstance(outcomes[3], PermanentJobError) and "no audio stream" in str(outcomes[3])
    for index in (0, 2):
        assert isinstance(outcomes[index], Transcript)
        assert_same_words(alone(clips[index]), outcomes[index], clips[index].name)  # type: ignore[arg-type]


def test_a_recording_longer_than_one_window_is_left_to_the_caller(engine: ClipBatchingEngine,
                                                                  short_clips: list[Path]) -> None:
    story = AUDIO_DIR / "story.ogg"
    assert media_seconds(story) > CLIP_WINDOW_S
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
    assert_same_words(alone(short_clips[0]), outcomes[0], short_clips[0].name)


class Gone(Exception):
    """What a progress callback raises when its job's lease was lost."""


def test_each_clip_streams_to_its_own_callback_and_a_raising_one_ends_only_its_clip(
        engine: ClipBatchingEngine, short_clips: list[Path]) -> None:
    seen: dict[int, list[str]] = {0: [], 1: [], 2: []}

    def callback(index: int):  # type: ignore[no-untyped-def]
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
