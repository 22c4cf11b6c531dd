"""The test kit's worker stop: once no task runs, the main process stops its own pool.

A pool child logs a task's end before its main process reads the result from the pool's
pipe. A group SIGTERM in that window kills the child under a job the main process still
counts as running, and billiard logs ``WorkerLostError`` for a task that succeeded, which
a log budget rightly refuses. Here the main process is frozen after a task, standing in for
one too busy to read its pipe: ``CeleryWorker.stop`` must signal it alone, never the child.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import uuid
from pathlib import Path

import psutil
import pytest
from celery import Celery

from devstack.infra.procs import freeze
from tests.kit.celery_worker import CeleryWorker
from tests.kit.voicy_stack import voicy_dev_stack
from tests.kit.waiting import wait_until

pytestmark = pytest.mark.slow  # starts a fleet process (tests/kit/fleet_guard.py)

WAIT_S = 30.0


def signal_masks(pid: int) -> dict[str, int]:
    """The signal masks of ``/proc/<pid>/status`` (``SigPnd``, ``ShdPnd``, ``SigCgt``...), by name."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {name: int(value, 16) for name, _, value in (line.partition(":\t") for line in lines)
            if name in ("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")}


def never_sent(masks: dict[str, int], sig: int) -> bool:
    """``sig`` is neither pending nor handled yet: billiard's handler resets itself when it runs, so a
    child that took its SIGTERM no longer catches it (``SigCgt``), even if it has not exited yet."""
    bit = 1 << (sig - 1)
    return not (masks["SigPnd"] | masks["ShdPnd"]) & bit and bool(masks["SigCgt"] & bit)


def test_stop_signals_the_main_process_alone_once_no_task_runs(tmp_path: Path, fresh_redis: str) -> None:
    with voicy_dev_stack(tmp_path, fresh_redis, "kit-stop") as (_server, _telegram, env):
        io = CeleryWorker("io", env, tmp_path / "io.log")
        io.wait_ready(fresh_redis)
        (child,) = psutil.Process(io.proc.pid).children()
        probe = Celery("probe", broker=fresh_redis)
        stopper = threading.Thread(target=io.stop, name="stop")
        try:
            task_id = str(uuid.uuid4())  # no grant: the task ends at once
            probe.send_task("voicy.download", args=[f"job-{task_id}", "no-such-grant"], task_id=task_id, queue="io")
            wait_until(lambda: f"voicy.download[{task_id}] succeeded" in io.log(), WAIT_S, "the task's end line")
            freeze(io.proc.pid)
            stopper.start()
            wait_until(lambda: not never_sent(signal_masks(io.proc.pid), signal.SIGTERM), WAIT_S,
                       "SIGTERM pending on the main process")
            assert never_sent(signal_masks(child.pid), signal.SIGTERM), "the child was signalled too"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(io.proc.pid, signal.SIGCONT)
            probe.close()
            if stopper.ident is None:  # failed before the stop began
                io.stop()
            else:
                stopper.join(WAIT_S * 2)
    assert not stopper.is_alive()
    assert io.proc.returncode == 0, io.log()[-2000:]
    assert not child.is_running()
    assert "WorkerLostError" not in io.log() and "exited with" not in io.log()
