"""``switchyard doctor`` passes against the devstack and names each broken piece."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from bridges import doctor
from deploy.devstack.telegram import FakeTelegram
from deploy.devstack.voicy_api import DevVoicyServer
from deploy.devstack.stack import BOT_TOKEN, TINY_MODEL_DIR

pytestmark = pytest.mark.slow


@pytest.fixture()
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str, nats_url: str, s3_endpoint: str):
    from deploy.devstack.cairn_core import DevCairnCore

    for key in list(os.environ):
        if key.startswith(("VOICY_", "CAIRN_", "AWS_")) or key == "TOKEN":
            monkeypatch.delenv(key)
    server = DevVoicyServer().start()
    telegram = FakeTelegram(BOT_TOKEN).start()
    core = DevCairnCore(nats_url, s3_endpoint, bucket="doctor-test")
    core.start()
    store = tmp_path / "media"
    store.mkdir()
    env = {"REDIS_URL": redis_url, "VOICY_WORKER_API_URL": server.url,
           "VOICY_WORKER_TOKEN": server.create_client("doctor"),
           "VOICY_WORKER_TELEGRAM_API_URL": telegram.url, "VOICY_WORKER_TELEGRAM_BOT_TOKEN": BOT_TOKEN,
           "VOICY_WORKER_MODEL": TINY_MODEL_DIR, "VOICY_WORKER_DEVICE": "auto",
           "VOICY_WORKER_MEDIA_STORE": str(store), "CAIRN_NATS_URL": nats_url, "CAIRN_PROVIDER": "strava",
           "CAIRN_WORKER_NAME": "strava-fetcher"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield monkeypatch, store
    core.stop()
    telegram.stop()
    server.stop()


def run_doctor() -> tuple[int, str]:
    out = io.StringIO()
    code = doctor.run(out)
    return code, out.getvalue()


def line(text: str, name: str) -> str:
    return next(row for row in text.splitlines() if f" {name}:" in row)


def test_doctor_passes_against_the_devstack(stack) -> None:
    code, text = run_doctor()
    assert code == 0, text
    for name in ("redis", "voicy token", "telegram getMe", "model", "media store", "nats + core release",
                 "provider credentials", "presign round trip"):
        assert line(text, name).startswith("ok"), text


def test_doctor_names_each_broken_piece(stack) -> None:
    monkeypatch, store = stack
    monkeypatch.setenv("VOICY_WORKER_TOKEN", "not-the-token-123")
    monkeypatch.setenv("VOICY_WORKER_MODEL", str(store / "no-such-model"))
    read_only = store / "read-only"
    read_only.write_text("a file, not a directory: nothing can be stored under it")
    monkeypatch.setenv("VOICY_WORKER_MEDIA_STORE", str(read_only))
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    code, text = run_doctor()
    assert code == 1
    assert line(text, "redis").startswith("FAIL") and "REDIS_URL" in line(text, "redis")
    assert "VOICY_WORKER_TOKEN rejected" in line(text, "voicy token")
    assert "VOICY_WORKER_MODEL" in line(text, "model") and line(text, "model").startswith("FAIL")
    assert "not writable" in line(text, "media store")
    assert "not-the-token-123" not in text
