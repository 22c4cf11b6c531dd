"""Voicy domain parts against real servers on loopback: settings, client, Telegram, store, engine."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path

import boto3
import pytest

from devstack.fakes.telegram import FakeTelegram
from devstack.fakes.voicy_api import DevVoicyServer
from devstack.infra.stack import AUDIO_DIR, BOT_TOKEN, TINY_MODEL_DIR, audio_manifest
from workers.errors import AuthError, ConfigError, PermanentJobError, RetryableJobError, StaleJobError
from workers.transcribe.device import pick_device
from workers.transcribe.whisper import WhisperEngine
from workers.voicy.bodies import transcript_body
from workers.voicy.client import VoicyClient
from workers.voicy.media_store import LocalMediaStore, MediaTooLarge, S3MediaStore
from workers.voicy.models import Source
from workers.voicy.progress import ProgressThrottle
from workers.voicy.settings import VoicySettings, load_voicy_settings
from workers.voicy.telegram import TelegramFiles, extension_for, file_url, is_token_bearing

TOKEN = "unit-voicy-token-SECRET-77aa"


@pytest.fixture()
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for key in ("VOICY_WORKER_API_URL", "VOICY_WORKER_TOKEN", "TOKEN", "VOICY_WORKER_TELEGRAM_BOT_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("VOICY_WORKER_WORK_DIR", str(tmp_path))
    return monkeypatch


def test_missing_and_invalid_variables_are_named(env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="VOICY_WORKER_API_URL.*VOICY_WORKER_TOKEN"):
        load_voicy_settings()
    env.setenv("VOICY_WORKER_API_URL", "http://127.0.0.1:1/worker/v1/")
    env.setenv("VOICY_WORKER_TOKEN", TOKEN)
    env.setenv("VOICY_WORKER_HEARTBEAT_INTERVAL_MS", "-5")
    with pytest.raises(ConfigError, match="VOICY_WORKER_HEARTBEAT_INTERVAL_MS") as info:
        load_voicy_settings()
    assert TOKEN not in str(info.value)
    env.setenv("VOICY_WORKER_HEARTBEAT_INTERVAL_MS", "")
    env.setenv("VOICY_WORKER_PROGRESS_INTERVAL_MS", "10")
    env.setenv("TOKEN", "42:bot-token-fallback")
    s = load_voicy_settings()
    assert s.api_url.endswith("/worker/v1") and s.progress_interval_ms == 1000
    assert s.heartbeat_interval_ms == 30000 and s.ready_queue_limit == 2  # no GPU here: no clip batches
    assert s.telegram_bot_token is not None
    assert s.telegram_bot_token.get_secret_value() == "42:bot-token-fallback"


def test_clip_batching_variables_are_checked_and_named(env: pytest.MonkeyPatch) -> None:
    env.setenv("VOICY_WORKER_API_URL", "http://127.0.0.1:1/worker/v1")
    env.setenv("VOICY_WORKER_TOKEN", TOKEN)
    env.setenv("VOICY_WORKER_TRANSCRIPTION_CONCURRENCY", "2")
    # unset: by device, 16 short voices per pass on CUDA (a whole batch per gpu slot waits, one more on
    # its way), none on a CPU (Voicy's backlog rule)
    env.setenv("VOICY_WORKER_DEVICE", "cuda")
    s = load_voicy_settings()
    assert s.clip_batching and s.clip_batch_on("cuda") == 16 and s.ready_queue_limit == 34  # (16 + 1) × 2
    env.setenv("VOICY_WORKER_DEVICE", "cpu")
    s = load_voicy_settings()
    assert s.clip_batch_on("cpu") == 1 and s.ready_queue_limit == 4 and s.clip_batch_wait_s == 0.25
    env.setenv("VOICY_WORKER_CLIP_BATCH_SIZE", "4")  # set: on every device
    s = load_voicy_settings()
    assert s.clip_batch_on("cpu") == s.clip_batch_on("cuda") == 4 and s.ready_queue_limit == 10
    env.setenv("VOICY_WORKER_CLIP_BATCH_SIZE", "0")
    assert not load_voicy_settings().clip_batching
    for name, bad in (("CLIP_BATCH_SIZE", "-1"), ("CLIP_BATCH_SIZE", "4.5"), ("CLIP_BATCH_WAIT_MS", "soon"),
                      ("CLIP_BATCH_WAIT_MS", "-5")):
        env.setenv(f"VOICY_WORKER_{name}", bad)
        with pytest.raises(ConfigError, match=f"VOICY_WORKER_{name}"):
            load_voicy_settings()
        env.delenv(f"VOICY_WORKER_{name}")


def test_the_stranded_grant_grace_defaults_to_a_minute_and_refuses_less_than_a_second(env: pytest.MonkeyPatch) -> None:
    env.setenv("VOICY_WORKER_API_URL", "http://127.0.0.1:1/worker/v1")
    env.setenv("VOICY_WORKER_TOKEN", TOKEN)
    assert load_voicy_settings().stranded_grant_s == 60.0
    env.setenv("VOICY_WORKER_STRANDED_GRANT_MS", "5000")
    assert load_voicy_settings().stranded_grant_s == 5.0
    for bad in ("999", "-1", "soon"):
        env.setenv("VOICY_WORKER_STRANDED_GRANT_MS", bad)
        with pytest.raises(ConfigError, match="VOICY_WORKER_STRANDED_GRANT_MS"):
            load_voicy_settings()


def test_numbers_follow_voicys_rule_and_fractional_slots_round_up(env: pytest.MonkeyPatch) -> None:
    """§6.1: empty → default, else ``Number(v)``; not finite or < 0 → error naming it; fractions allowed."""
    env.setenv("VOICY_WORKER_API_URL", "http://127.0.0.1:1/worker/v1")
    env.setenv("VOICY_WORKER_TOKEN", TOKEN)
    for name in ("DOWNLOAD_CONCURRENCY", "TRANSCRIPTION_CONCURRENCY", "READY_QUEUE_LIMIT"):
        env.setenv(f"VOICY_WORKER_{name}", "")
    s = load_voicy_settings()
    assert (s.download_concurrency, s.transcription_concurrency, s.ready_queue_limit) == (2, 1, 2)
    # Voicy's client admits work while `running < v`: 2.5 downloads means 3 in flight.
    env.setenv("VOICY_WORKER_DOWNLOAD_CONCURRENCY", "2.5")
    env.setenv("VOICY_WORKER_TRANSCRIPTION_CONCURRENCY", "1.2")
    s = load_voicy_settings()
    assert (s.download_concurrency, s.transcription_concurrency) == (3, 2)
    assert s.ready_queue_limit == 3  # max(2.5, 2 × 1.2) = 2.5 → 3, as Voicy derives it (not 2 × 2)
    assert all(type(v) is int for v in (s.download_concurrency, s.transcription_concurrency,
                                         s.ready_queue_limit))
    env.setenv("VOICY_WORKER_READY_QUEUE_LIMIT", "0.25")  # then max(1, v)
    env.setenv("VOICY_WORKER_TRANSCRIPTION_CONCURRENCY", "0")
    s = load_voicy_settings()
    assert (s.ready_queue_limit, s.transcription_concurrency) == (1, 1)
    env.setenv("VOICY_WORKER_READY_QUEUE_LIMIT", "0x10")  # Number("0x10") is 16
    env.setenv("VOICY_WORKER_POLL_INTERVAL_MS", "1e3")
    s = load_voicy_settings()
    assert s.ready_queue_limit == 16 and s.poll_interval_ms == 1000
    for name in ("DOWNLOAD_CONCURRENCY", "READY_QUEUE_LIMIT", "POLL_INTERVAL_MS", "STALE_ACTIVE_JOB_MS"):
        for bad in ("2 jobs", "-1", "Infinity", "NaN", "1_000"):
            env.setenv(f"VOICY_WORKER_{name}", bad)
            with pytest.raises(ConfigError, match=f"VOICY_WORKER_{name}: .*must be a non-negative number"):
                load_voicy_settings()
        env.delenv(f"VOICY_WORKER_{name}")


def test_only_documented_names_set_the_model_and_the_media_limit(env: pytest.MonkeyPatch) -> None:
    """Bare ``MODEL``/``MAX_MEDIA_FILE_SIZE_MB`` (any process may have them) must not configure us."""
    for key in ("VOICY_WORKER_MODEL", "VOICY_WHISPER_MODEL", "VOICY_WORKER_MAX_MEDIA_BYTES",
                "VOICY_MAX_MEDIA_FILE_SIZE_MB"):
        env.delenv(key, raising=False)
    env.setenv("VOICY_WORKER_API_URL", "http://127.0.0.1:1/worker/v1")
    env.setenv("VOICY_WORKER_TOKEN", TOKEN)
    env.setenv("MODEL", "gpt-4o")
    env.setenv("MAX_MEDIA_FILE_SIZE_MB", "1")
    env.setenv("VOICY_WORKER_MAX_MEDIA_FILE_SIZE_MB", "1")  # a field name under our prefix: not documented
    s = load_voicy_settings()
    assert s.model == "large-v3"
    assert s.max_media_bytes == 20 * 1024 * 1024
    env.setenv("VOICY_WHISPER_MODEL", "small")
    assert load_voicy_settings().model == "small"
    env.setenv("VOICY_WORKER_MODEL", "base")  # Voicy's order: ours first, then the adapter's
    assert load_voicy_settings().model == "base"
    env.setenv("VOICY_MAX_MEDIA_FILE_SIZE_MB", "2.5")  # the server's variable, in MB, fractions allowed
    assert load_voicy_settings().max_media_bytes == int(2.5 * 1024 * 1024)
    env.setenv("VOICY_WORKER_MAX_MEDIA_BYTES", "1000")  # ours wins
    assert load_voicy_settings().max_media_bytes == 1000
    env.setenv("VOICY_MAX_MEDIA_FILE_SIZE_MB", "lots")
    with pytest.raises(ConfigError, match="VOICY_MAX_MEDIA_FILE_SIZE_MB"):
        load_voicy_settings()


def test_client_maps_statuses_and_never_logs_the_token(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with DevVoicyServer() as server, ExitStack() as stack:
        token = server.create_client("unit", token=TOKEN)
        client = VoicyClient(server.url, token, timeout_s=5)
        stack.callback(client.close)
        assert client.claim_download("oldest") is None
        job_id = server.enqueue_job("fid-1")
        job = client.claim_download("newest")
        assert job and job.id == job_id and job.status == "downloading" and job.attempts == 1
        with pytest.raises(StaleJobError):
            client.transcribe(job_id)  # not ready yet: 404 job_not_found
        server.inject_failure("heartbeat", status=503, times=2)
        assert client.heartbeat(job_id).status == "downloading"  # retried past two 503s
        server.inject_failure("heartbeat", status=503, times=50)
        with pytest.raises(RetryableJobError), VoicyClient(server.url, token, timeout_s=5, retry_attempts=2) as few:
            few.heartbeat(job_id)
        with pytest.raises(AuthError, match="VOICY_WORKER_TOKEN"), \
                VoicyClient(server.url, "wrong-token-value", timeout_s=5) as wrong:
            wrong.claim_download("oldest")
        assert client.failure(job_id, "boom", retryable=True).status == "queued_for_download"
    assert TOKEN not in caplog.text


def test_telegram_cloud_and_local_forms_and_token_safety(tmp_path: Path) -> None:
    data = (AUDIO_DIR / audio_manifest()[0]["file"]).read_bytes()
    with ExitStack() as stack:  # every client closed at the end, its pooled connections with it
        for local in (False, True):
            tg = FakeTelegram(BOT_TOKEN, local_mode=local).start()
            try:
                tg.add_file("fid", data)
                settings = _settings(tg.url, tmp_path)
                files = TelegramFiles(settings)
                stack.callback(files.close)
                got = b"".join(files.open_source(Source(job_id="j", file_id="fid")))
                assert got == data
                with pytest.raises(RetryableJobError) as info:
                    b"".join(files.open_source(Source(job_id="j", file_id="missing")))
                assert BOT_TOKEN not in str(info.value)
                tg.fail_next("fid", status=404)
                with pytest.raises(RetryableJobError):
                    b"".join(files.open_source(Source(job_id="j", file_id="fid")))
            finally:
                tg.stop()
        no_token = _settings("http://127.0.0.1:9", tmp_path, bot_token=None)
        with pytest.raises(PermanentJobError, match="required to resolve"), TelegramFiles(no_token) as files:
            files.open_source(Source(job_id="j", file_id="x"))


def test_telegram_timeout_is_retryable(tmp_path: Path) -> None:
    tg = FakeTelegram(BOT_TOKEN).start()
    try:
        tg.add_file("slow", b"x" * 10)
        tg.delay("slow", 3.0)
        with TelegramFiles(_settings(tg.url, tmp_path, timeout_ms=300)) as files, \
                pytest.raises(RetryableJobError, match="Timeout") as info:
            b"".join(files.open_source(Source(job_id="j", file_id="slow")))
        assert BOT_TOKEN not in str(info.value)
    finally:
        tg.stop()


def test_url_rules() -> None:
    assert is_token_bearing("https://api.telegram.org/file/bot123:AAbb_cc-dd/voice/x.oga")
    assert not is_token_bearing("https://example.invalid/proof.ogg")
    assert file_url("http://h", "1:t", "/voice/a b.oga") == "http://h/file/bot1:t/voice/a%20b.oga"
    assert extension_for(Source(job_id="j", mime_type="audio/mpeg; x=1")) == ".mp3"
    assert extension_for(Source(job_id="j", source_kind="video_note")) == ".mp4"
    assert extension_for(Source(job_id="j", file_path="voice/file_1.oga")) == ".oga"


def test_local_store_is_atomic_and_bounded(tmp_path: Path) -> None:
    store = LocalMediaStore(tmp_path)
    assert store.put_stream("a.ogg", [b"12", b"34"], max_bytes=10) == 4
    with pytest.raises(MediaTooLarge):
        store.put_stream("b.ogg", [b"x" * 8, b"y" * 8], max_bytes=10)
    assert not store.exists("b.ogg") and not list(tmp_path.glob(".*part"))
    with store.local_path("a.ogg") as p:
        assert p.read_bytes() == b"1234"
    store.delete("a.ogg")
    assert not store.exists("a.ogg")


def test_s3_store_round_trip_against_moto_server(s3_endpoint: str) -> None:
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
    client.create_bucket(Bucket="media")
    store = S3MediaStore("media", "jobs", client=client)
    store.put_stream("j1.ogg", [b"abc"], max_bytes=100)
    assert store.exists("j1.ogg") and store.describe("j1.ogg") == "s3://media/jobs/j1.ogg"
    with store.local_path("j1.ogg") as p:
        assert p.read_bytes() == b"abc" and p.suffix == ".ogg"
    store.delete("j1.ogg")
    assert not store.exists("j1.ogg")


@pytest.mark.model
def test_engine_auto_device_streams_segments_and_rejects_garbage(tmp_path: Path) -> None:
    assert pick_device("auto") == "cpu"  # no GPU on these machines
    settings = _settings("http://127.0.0.1:9", tmp_path, model=TINY_MODEL_DIR)
    engine = WhisperEngine(settings)
    assert engine.device == "cpu" and engine.compute_type == "int8"
    story = max(audio_manifest(), key=lambda m: m["duration_s"])
    seen: list[int] = []
    transcript = engine.transcribe(AUDIO_DIR / story["file"], on_segment=lambda t: seen.append(len(t.parts)))
    assert seen == sorted(seen) and len(seen) >= 3
    body = transcript_body(transcript, settings.engine, engine.metadata).body()
    assert body["engine"] == "faster-whisper" and body["metadata"]["computeType"] == "int8"
    assert None not in body.values() and all(p["timeCode"] for p in body["parts"])
    with pytest.raises(PermanentJobError):
        engine.transcribe(AUDIO_DIR / "undecodable.ogg")


def test_progress_throttle_needs_growth_and_interval() -> None:
    now = [0.0]
    throttle = ProgressThrottle(1.0, clock=lambda: now[0])
    assert not throttle.should_send("hello")  # interval not yet passed
    now[0] = 1.0
    assert throttle.should_send("hello")
    now[0] = 2.5
    assert not throttle.should_send("hello")  # no growth
    assert throttle.should_send("hello world")


def _settings(tg_url: str, tmp: Path, bot_token: str | None = BOT_TOKEN, timeout_ms: int = 5000,
              model: str = "large-v3") -> VoicySettings:
    return VoicySettings(api_url="http://127.0.0.1:9/worker/v1", token=TOKEN, work_dir=tmp,
                         telegram_api_url=tg_url, telegram_bot_token=bot_token,
                         download_timeout_ms=timeout_ms, model=model, device="auto")
