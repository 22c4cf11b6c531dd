"""``switchyard doctor`` passes against the devstack, names each broken piece, and always ends.

The unreachable-service tests run the doctor as an operator does (its own
process, ``python -m ops doctor``) against loopback ports nothing listens on.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.fakes.telegram import FakeTelegram
from devstack.fakes.voicy_api import DevVoicyServer
from devstack.infra import services
from devstack.infra.services import free_port
from devstack.infra.stack import BOT_TOKEN, TINY_MODEL_DIR
from ops import doctor

pytestmark = pytest.mark.slow


@pytest.fixture()
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str, nats_url: str,
          s3_endpoint: str) -> Iterator[tuple[pytest.MonkeyPatch, Path]]:
    from devstack.fakes.cairn_core import DevCairnCore

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
    server_nats = services.started_nats(nats_url)
    if server_nats is not None:  # the doctor checks as the pool, within core's permission template
        env |= services.nats_login(server_nats, "strava", "strava-fetcher").env()
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


def test_doctor_passes_against_the_devstack(stack: tuple[pytest.MonkeyPatch, Path]) -> None:
    code, text = run_doctor()
    assert code == 0, text
    for name in ("fleet settings", "redis", "voicy token", "telegram getMe", "model", "media store", "cairn pool",
                 "nats + core release", "provider credentials", "presign round trip"):
        assert line(text, name).startswith("ok"), text
    assert "pool strava-fetcher: provider strava" in line(text, "cairn pool")


def test_doctor_names_each_broken_piece(stack: tuple[pytest.MonkeyPatch, Path]) -> None:
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


# ------------------------------------------------------------------ a doctor that always ends
ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 120  # far above the doctor's own timeouts; only a hang reaches it
REDIS_PASSWORD = "sy-redis-SECRET-p@ss"  # an @ inside: the mask must cover it all


def doctor_process(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VOICY_", "CAIRN_", "AWS_", "REDIS_"))}
    return subprocess.run([sys.executable, "-m", "ops", "doctor"], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=HANG_GUARD_S)


def test_doctor_ends_with_one_fail_line_per_unreachable_service() -> None:
    """nats-py reads max_reconnect_attempts=0 as "unlimited": the doctor used to retry for ever,
    printing a traceback per attempt. Now: one FAIL line for Redis, one for NATS, nothing else.
    The Redis line names the URL it tried, its password masked."""
    redis_port = free_port()
    out = doctor_process({"REDIS_URL": f"redis://ops:{REDIS_PASSWORD}@127.0.0.1:{redis_port}/0",
                          "CAIRN_NATS_URL": f"nats://127.0.0.1:{free_port()}"})
    assert REDIS_PASSWORD not in out.stdout + out.stderr
    assert f"cannot reach REDIS_URL redis://ops:***@127.0.0.1:{redis_port}/0 (" in line(out.stdout, "redis")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    assert out.stderr == "", out.stderr
    lines = out.stdout.splitlines()
    fails = [row for row in lines if row.startswith("FAIL")]
    assert len(fails) == 2, out.stdout
    assert fails[0].startswith("FAIL redis:") and "REDIS_URL" in fails[0]
    assert fails[1].startswith("FAIL nats + core release:") and "CAIRN_NATS_URL" in fails[1]
    assert line(out.stdout, "provider credentials").startswith("skip")
    assert line(out.stdout, "presign round trip").startswith("skip")
    assert line(out.stdout, "cairn pool").startswith("ok")  # built offline: NATS is not needed for it
    assert lines[-1] == "2 passed, 2 failed, 3 skipped"


def test_doctor_counts_skipped_checks_as_skipped(redis_url: str) -> None:
    """Only Redis is checked here: one pass, and the two unconfigured sides are skipped, not passed."""
    out = doctor_process({"REDIS_URL": redis_url})
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ok   fleet settings:") and lines[1].startswith("ok   redis:")
    assert [row.split(":")[0] for row in lines[2:4]] == ["skip voicy", "skip cairn"]
    assert lines[-1] == "2 passed, 0 failed, 2 skipped"


def test_doctor_names_an_unreachable_voicy_api(redis_url: str, tmp_path: Path) -> None:
    """One retry-free probe: an unreachable Worker API is one FAIL line naming the variable."""
    out = doctor_process({"REDIS_URL": redis_url, "VOICY_WORKER_API_URL": f"http://127.0.0.1:{free_port()}",
                          "VOICY_WORKER_TOKEN": "sy-doctor-token-SECRET", "VOICY_WORKER_MODEL": TINY_MODEL_DIR,
                          "VOICY_WORKER_TELEGRAM_API_URL": f"http://127.0.0.1:{free_port()}",
                          "VOICY_WORKER_TELEGRAM_BOT_TOKEN": BOT_TOKEN,
                          "VOICY_WORKER_MEDIA_STORE": str(tmp_path)})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    assert line(out.stdout, "voicy token").startswith("FAIL")
    assert "cannot reach VOICY_WORKER_API_URL" in line(out.stdout, "voicy token")
    assert line(out.stdout, "telegram getMe").startswith("FAIL")
    assert line(out.stdout, "media store").startswith("ok")
    assert "SECRET" not in out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == "4 passed, 2 failed, 1 skipped"


def test_doctor_names_a_bad_value_every_celery_process_would_stop_on(redis_url: str) -> None:
    """The doctor loads the Celery app as ``celery -A tasks`` does: a bad beat period is named there,
    and Redis (whose URL the same settings give) is skipped rather than blamed."""
    # Beat reads Voicy's periods when Voicy is configured (a Cairn period is read only by the provider
    # worker itself, at its start: tests/fleet/test_start_config.py).
    out = doctor_process({"REDIS_URL": redis_url, "VOICY_WORKER_API_URL": f"http://127.0.0.1:{free_port()}",
                          "VOICY_WORKER_TOKEN": "unused-token", "VOICY_WORKER_HEARTBEAT_INTERVAL_MS": "abc"})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    assert line(out.stdout, "fleet settings").startswith("FAIL")
    assert "VOICY_WORKER_HEARTBEAT_INTERVAL_MS" in line(out.stdout, "fleet settings")
    assert line(out.stdout, "redis").startswith("skip")
    assert "abc" not in out.stdout


@pytest.mark.parametrize(("variable", "value"), [
    ("CAIRN_PROVIDER", "no-such-provider"),  # not installed: no built-in, no entry point
    ("CAIRN_STRAVA_WEBHOOK_COALESCE_S", "9999"),  # the provider's own setting, found through the provider
])
def test_doctor_names_a_pool_whose_provider_cannot_be_built(redis_url: str, variable: str, value: str) -> None:
    """The pool check builds the configured provider as its bridge and workers would, by name through the
    registry: a bad provider or provider setting is one FAIL line naming it, whatever the provider."""
    out = doctor_process({"REDIS_URL": redis_url, "CAIRN_NATS_URL": f"nats://127.0.0.1:{free_port()}",
                          variable: value})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr, out.stderr
    assert line(out.stdout, "cairn pool").startswith("FAIL") and variable in line(out.stdout, "cairn pool")


# ------------------------------------------------------------------ the model check never downloads
class RecordingHub:
    """A stand-in Hugging Face Hub on loopback (``HF_ENDPOINT``): it records every request and has no repo.

    faster-whisper resolves a model *name* through ``huggingface_hub.snapshot_download``; any request
    reaching this server is the start of a download the doctor must never make.
    """

    def __init__(self) -> None:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        from devstack.fakes.http_server import BackgroundServer

        self.requests: list[str] = []

        async def anything(request: Request) -> JSONResponse:
            self.requests.append(f"{request.method} {request.url.path}")
            return JSONResponse({"error": "Repository not found"}, status_code=404)

        app = Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "HEAD", "POST"])])
        self.server = BackgroundServer(app, "recording-hub").start()
        self.url = f"http://127.0.0.1:{self.server.port}"


def _voicy_env(redis_url: str, tmp_path: Path, model: str) -> dict[str, str]:
    return {"REDIS_URL": redis_url, "VOICY_WORKER_API_URL": f"http://127.0.0.1:{free_port()}",
            "VOICY_WORKER_TOKEN": "unused-token", "VOICY_WORKER_MODEL": model,
            "VOICY_WORKER_TELEGRAM_BOT_TOKEN": BOT_TOKEN, "VOICY_WORKER_MEDIA_STORE": str(tmp_path),
            "HF_HOME": str(tmp_path / "hf-home")}  # an empty cache: this host has downloaded nothing


def test_a_model_name_the_host_lacks_is_named_and_never_downloaded(redis_url: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # as on an operator's online host
        monkeypatch.delenv(offline, raising=False)
    hub = RecordingHub()
    try:
        out = doctor_process(_voicy_env(redis_url, tmp_path, "small") | {"HF_ENDPOINT": hub.url})
    finally:
        hub.server.stop()
    assert hub.requests == [], "the doctor started a model download"
    model = line(out.stdout, "model")
    assert model.startswith("FAIL model: VOICY_WORKER_MODEL=small does not load on auto: "), out.stdout
    assert "small is not downloaded on this host (the doctor never downloads" in model, model
    assert "ConfigError" not in model and "Traceback" not in out.stdout + out.stderr


def test_the_model_line_shows_the_underlying_error(redis_url: str, tmp_path: Path) -> None:
    """Not ``does not load on auto: ConfigError``: what CTranslate2 or the path said."""
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    out = doctor_process(_voicy_env(redis_url, tmp_path, str(empty)))
    assert f"RuntimeError: Unable to open file 'model.bin' in model '{empty}'" in line(out.stdout, "model"), out.stdout
    out = doctor_process(_voicy_env(redis_url, tmp_path, str(tmp_path / "missing")))
    assert line(out.stdout, "model").endswith(f"no directory {tmp_path / 'missing'} on this host"), out.stdout
