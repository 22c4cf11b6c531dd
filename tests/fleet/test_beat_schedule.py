"""Beat's schedule: built at ``import tasks`` in every Celery process, from validated periods.

A bad Voicy period must stop start-up naming the variable (not crash with a bare
``float()`` error, nor silently drop the heartbeat), an empty one means the
default, and a Cairn-only process must not need, or even read, any Voicy variable.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.beat import build_schedule
from workers.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
API_URL = "http://127.0.0.1:9/worker/v1"
HEARTBEAT = "VOICY_WORKER_HEARTBEAT_INTERVAL_MS"
LEASE = "VOICY_WORKER_LEASE_TTL_MS"
START_TIMEOUT_S = 120.0


@pytest.fixture()
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in [k for k in os.environ if k.startswith(("VOICY_", "CAIRN_"))]:
        monkeypatch.delenv(key)
    return monkeypatch


def test_voicy_periods_are_validated_like_the_fleet_settings(env: pytest.MonkeyPatch) -> None:
    env.setenv("VOICY_WORKER_API_URL", API_URL)  # configured; the token is not needed for a schedule
    for name, bad in ((HEARTBEAT, "30s"), (HEARTBEAT, "-5"), (HEARTBEAT, "Infinity"), (LEASE, "abc"),
                      (LEASE, "-1")):
        env.setenv(name, bad)
        with pytest.raises(ConfigError, match=f"{name}: .*must be a non-negative number"):
            build_schedule()
        env.delenv(name)
    env.setenv(LEASE, "50")
    with pytest.raises(ConfigError, match=f"{LEASE}: .*at least 100"):
        build_schedule()  # a lease this short would reap every 25 ms
    env.setenv(HEARTBEAT, "")
    env.setenv(LEASE, "")
    schedule = build_schedule()
    assert schedule["voicy-heartbeat"]["schedule"] == 30.0  # empty → the default
    assert schedule["voicy-reap"]["schedule"] == 5.0
    env.setenv(HEARTBEAT, "2500.5")
    env.setenv(LEASE, "2000")
    schedule = build_schedule()
    assert schedule["voicy-heartbeat"]["schedule"] == pytest.approx(2.5005)
    assert schedule["voicy-reap"]["schedule"] == 1.0  # half the lease
    env.setenv(HEARTBEAT, "0")
    assert "voicy-heartbeat" not in build_schedule() and "voicy-reap" in build_schedule()


def test_a_cairn_only_process_reads_no_voicy_variable(env: pytest.MonkeyPatch) -> None:
    env.setenv(HEARTBEAT, "30s")
    env.setenv(LEASE, "abc")
    env.setenv("CAIRN_NATS_URL", "nats://127.0.0.1:9")
    schedule = build_schedule()
    assert not [name for name in schedule if name.startswith("voicy-")]
    assert schedule == {}  # presence and the manifest are each provider worker's own timer (tasks.presence)


def _celery_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOICY_", "CAIRN_"))}
    env.update(REDIS_URL="redis://127.0.0.1:9/0", PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.mark.slow
def test_a_bad_period_stops_a_celery_process_at_start_naming_the_variable() -> None:
    bad = _celery_env(VOICY_WORKER_API_URL=API_URL, **{HEARTBEAT: "30s"})
    out = subprocess.run([sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "io", "-P", "solo"],
                         cwd=ROOT, env=bad, capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert out.returncode != 0
    assert f"{HEARTBEAT}: Value error, must be a non-negative number" in out.stdout + out.stderr
    # The same bad value without Voicy configured (a Cairn-only process) is not read at all.
    cairn_only = _celery_env(**{HEARTBEAT: "30s"})
    code = "import tasks; assert not tasks.app.conf.beat_schedule"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=cairn_only, check=True, timeout=START_TIMEOUT_S)


@pytest.mark.slow
def test_a_bad_voicy_variable_stops_a_voicy_worker_at_start_naming_it() -> None:
    """Not only beat's periods: any bad ``VOICY_WORKER_*`` stops an io/gpu worker before it takes a job."""
    bad = _celery_env(VOICY_WORKER_API_URL=API_URL, VOICY_WORKER_TOKEN="t", VOICY_WORKER_LANGUAGE="klingon")
    out = subprocess.run([sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "gpu", "-P", "solo"],
                         cwd=ROOT, env=bad, capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "VOICY_WORKER_LANGUAGE" in out.stderr
    assert "ready" not in out.stdout + out.stderr  # it never got to consuming


def test_beat_reads_no_cairn_period(env: pytest.MonkeyPatch) -> None:
    """Presence and the manifest are renewed by each provider worker itself (C5, C6: beat knows no pool),
    so beat reads no ``CAIRN_*`` variable: a bad one stops only the Cairn side's own processes (see
    ``test_presence_procfile``), not ``import tasks``."""
    env.setenv("CAIRN_NATS_URL", "nats://127.0.0.1:9")
    env.setenv("CAIRN_PROVIDER", "Not A Name")
    env.setenv("CAIRN_PRESENCE_INTERVAL_S", "60")  # core counts a record live for 45 s: invalid
    schedule = build_schedule()
    assert schedule == {}
