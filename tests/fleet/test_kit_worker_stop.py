"""The test kit's worker stop: the group is signalled only once the main process holds no task.

A pool child logs a task's end before its main process reads the result from the pool's
pipe. A group SIGTERM in that window kills the child under a job the main process still
counts as running, and billiard logs ``WorkerLostError`` for a task that succeeded, which
a log budget rightly refuses. Here the main process is frozen after a task, standing in for
one too busy to read its pipe: ``CeleryWorker.stop`` must ask it before signalling anyone.
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
import redis
from celery import Celery

from devstack.infra.procs import freeze
from tests.kit.celery_worker import CeleryWorker
from tests.kit.voicy_stack import voicy_dev_stack
from tests.kit.waiting import wait_until

pytestmark = pytest.mark.slow  # starts a fleet process (tests/kit/fleet_guard.py)

PIDBOX_CHANNELS = "*celery.pidbox*"  # kombu's pub/sub channel of Celery's broadcast control commands
WAIT_S = 30.0


def test_stop_asks_the_main_process_before_it_signals_the_group(tmp_path: Path, fresh_redis: str) -> None:
    with voicy_dev_stack(tmp_path, fresh_redis, "kit-stop") as (_server, _telegram, env):
        io = CeleryWorker("io", env, tmp_path / "io.log")
        io.wait_ready(fresh_redis)
        (child,) = psutil.Process(io.proc.pid).children()
        probe = Celery("probe", broker=fresh_redis)
        control = redis.Redis.from_url(fresh_redis).pubsub()
        stopper = threading.Thread(target=io.stop, name="stop")
        try:
            task_id = str(uuid.uuid4())  # no grant: the task ends at once
            probe.send_task("voicy.download", args=[f"job-{task_id}", "no-such-grant"], task_id=task_id, queue="io")
            wait_until(lambda: f"voicy.download[{task_id}] succeeded" in io.log(), WAIT_S, "the task's end line")
            freeze(io.proc.pid)
            control.psubscribe(PIDBOX_CHANNELS)
            wait_until(lambda: (control.get_message(timeout=0.1) or {}).get("type") == "psubscribe", WAIT_S,
                       "the subscription")
            stopper.start()
            wait_until(lambda: (control.get_message(timeout=0.1) or {}).get("type") == "pmessage", WAIT_S,
                       "stop() to ask the main process what it runs")
            assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE, "the group was signalled"
        finally:
            with contextlib.suppress(ProcessLookupError):  # gone: the group was signalled
                os.kill(io.proc.pid, signal.SIGCONT)
            control.close()
            probe.close()
            if stopper.ident is None:  # failed before the stop began
                io.stop()
            else:
                stopper.join(WAIT_S)
    assert not stopper.is_alive()
    assert io.proc.poll() is not None and not child.is_running()
    assert "WorkerLostError" not in io.log() and "exited with" not in io.log()
