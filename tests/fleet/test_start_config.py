"""A bad value at Celery start is one line naming the variable and a non-zero exit, like the bridges.

Each case runs the Procfile's own command line (``bash -c``, as honcho and
Heroku run it): ``celery -A tasks worker ...``, ``celery -A tasks beat ...``
and Flower's ``celery -A tasks flower ...``. The values are read while
``tasks`` is imported, inside Celery's command line, which used to answer with
"Unable to load celery application" and a 40-line traceback.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from devstack.infra.services import free_port

pytestmark = pytest.mark.slow  # starts fleet processes (tests/kit/fleet_guard.py)

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
SHELL = shutil.which("bash") or "/bin/sh"
EXIT_CONFIG_ERROR = 2  # tasks.EXIT_CONFIG_ERROR, as python -m bridges
HANG_GUARD_S = 120  # only a process that started anyway (the bug) gets near it
ROOT_WARNING = re.compile(r"^\S*celery/platforms\.py:\d+: SecurityWarning: You're running the worker with superuser "
                          r"privileges.*?_warn_or_raise_security_error\(.*?\n", re.S | re.M)
_PROCFILE_LINE = re.compile(r"^([A-Za-z0-9_-]+):\s*(.+)$")  # honcho's own pattern


def procfile_command(process_type: str) -> str:
    for line in (ROOT / "Procfile").read_text().splitlines():
        match = _PROCFILE_LINE.match(line)
        if match and match.group(1) == process_type:
            return match.group(2)
    raise KeyError(process_type)


def start(process_type: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VOICY_", "CAIRN_", "AWS_", "REDIS_"))}
    base.update({"PATH": f"{VENV_BIN}:{base.get('PATH', '')}", "PORT": str(free_port()),
                 # Both sides configured, so beat reads both sides' periods; nothing listens here.
                 "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                 "VOICY_WORKER_API_URL": f"http://127.0.0.1:{free_port()}", "VOICY_WORKER_TOKEN": "unused-token",
                 "CAIRN_NATS_URL": f"nats://127.0.0.1:{free_port()}"})
    return subprocess.run([SHELL, "-c", procfile_command(process_type)], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=HANG_GUARD_S)


def without_root_warning(text: str) -> str:
    """The output less Celery's own SecurityWarning about running as root (CI runs as root).

    A worker prints it while it starts, before the provider pool's start check can
    run (that check needs the worker's queues, known only then); it is Celery's
    warning about the user, not a traceback of ours, and absent for any other user.
    """
    return ROOT_WARNING.sub("", text)


@pytest.mark.parametrize(("variable", "value", "process_type", "verb"), [
    ("REDIS_URL", "notaurl", "gpu", "worker"),
    ("REDIS_URL", "notaurl", "beat", "beat"),
    ("REDIS_URL", "notaurl", "web", "flower"),
    ("VOICY_WORKER_HEARTBEAT_INTERVAL_MS", "30s", "io", "worker"),
    ("VOICY_WORKER_HEARTBEAT_INTERVAL_MS", "30s", "beat", "beat"),
    ("CAIRN_PRESENCE_INTERVAL_S", "abc", "provider", "worker"),
    # A Strava API on plain http away from loopback (a second host of the partition harness): the
    # manifest's authorize URL would be http on a non-loopback host, which contract §1 forbids, so
    # the pool could never publish its manifest (a traceback every manifest period, found by
    # bench partitions). The pool refuses it at start instead.
    ("CAIRN_STRAVA_BASE_URL", "http://10.77.0.10:4000", "provider", "worker"),
])
def test_a_bad_value_stops_celery_with_one_line(variable: str, value: str, process_type: str, verb: str) -> None:
    out = start(process_type, {variable: value})
    text = out.stdout + out.stderr
    assert out.returncode == EXIT_CONFIG_ERROR, text
    lines = [row for row in without_root_warning(text).splitlines() if row.strip()]
    assert len(lines) == 1, text
    assert lines[0].startswith(f"switchyard celery {verb}: invalid configuration: {variable}: "), text
    assert value not in lines[0]  # the value may be a secret; the variable's name is enough


LEGACY_QUEUE = "provider"  # the queue every pool shared before issue 16


def provider_line_on(queue: str) -> str:
    """The Procfile's provider line consuming ``queue`` instead of its pool's (an older Procfile's line)."""
    line = procfile_command("provider")
    assert " -Q provider.${CAIRN_WORKER_NAME:-strava-fetcher} " in line, line
    return line.replace("provider.${CAIRN_WORKER_NAME:-strava-fetcher}", queue)


@pytest.mark.parametrize(("queue", "env", "expected"), [
    (LEGACY_QUEUE, {"CAIRN_WORKER_NAME": "strava-fetcher"},
     "-Q provider is gone: each provider pool consumes its own queue, provider.<CAIRN_WORKER_NAME>; "
     "run this one with -Q provider.strava-fetcher (docs/operations.md 2.5)"),
    (LEGACY_QUEUE, {"CAIRN_NATS_URL": ""},  # not even a Voicy-only app runs the old line silently
     "-Q provider is gone: each provider pool consumes its own queue, provider.<CAIRN_WORKER_NAME>; "
     "run this one with -Q provider.<CAIRN_WORKER_NAME> (docs/operations.md 2.5)"),
    ("provider.garmin-fetcher", {"CAIRN_WORKER_NAME": "strava-fetcher"},
     "-Q provider.garmin-fetcher is not this pool's queue: CAIRN_WORKER_NAME=strava-fetcher consumes "
     "provider.strava-fetcher"),
])
def test_a_provider_worker_on_another_queue_than_its_pools_stops_with_one_line(
        queue: str, env: dict[str, str], expected: str) -> None:
    """The choice for ``-Q provider`` (issue 16): no silent fallback. A worker on the shared queue would
    receive nothing (the bridges send to provider.<pool>) or, on another pool's queue, run that pool's
    jobs with its own provider; it stops at start, before it consumes, naming what to run instead."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VOICY_", "CAIRN_", "AWS_", "REDIS_"))}
    base.update({"PATH": f"{VENV_BIN}:{base.get('PATH', '')}", "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                 "CAIRN_NATS_URL": f"nats://127.0.0.1:{free_port()}", "PROVIDER_CONCURRENCY": "1"})
    merged = {k: v for k, v in {**base, **env}.items() if v}
    out = subprocess.run([SHELL, "-c", provider_line_on(queue)], cwd=ROOT, env=merged,
                         capture_output=True, text=True, timeout=HANG_GUARD_S)
    text = out.stdout + out.stderr
    assert out.returncode == EXIT_CONFIG_ERROR, text
    lines = [row for row in without_root_warning(text).splitlines() if row.strip()]
    assert lines == [f"switchyard celery worker: {expected}"], text
    assert " ready." not in text


@pytest.mark.parametrize(("process_type", "who"), [("io", "voicy worker"), ("gpu", "voicy worker"),
                                                   ("voicy_bridge", "voicy bridge")])
def test_on_heroku_a_voicy_process_refuses_a_local_media_store(process_type: str, who: str) -> None:
    """Heroku (``DYNO`` set) gives io and gpu separate disks: a local store would fail every transcription
    with "downloaded media is missing", so each Voicy process stops at start naming the variable."""
    out = start(process_type, {"DYNO": f"{process_type}.1", "VOICY_WORKER_MEDIA_STORE": ""})
    text = out.stdout + out.stderr
    assert out.returncode == EXIT_CONFIG_ERROR, text
    lines = [row for row in without_root_warning(text).splitlines() if row.strip()]
    assert lines == [f"switchyard {who}: invalid configuration: VOICY_WORKER_MEDIA_STORE: Value error, must be an "
                     "s3://bucket/prefix URL on Heroku (DYNO is set): dynos share no disk"], text
