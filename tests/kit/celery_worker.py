"""A real ``celery -A tasks worker`` process for a test, and the ``celery_workers`` fixture that starts them."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from celery import Celery

from devstack.infra.procs import spawn, stop_group

WORKER_READY_TIMEOUT_S = 60.0
WORKER_STOP_TIMEOUT_S = 15.0
PING_TIMEOUT_S = 0.5
# How long stop() lets a task that is still running end before it stops the worker: a job can be
# final at its counterpart (its result posted) while its task still runs its last lines.
WORKER_DRAIN_TIMEOUT_S = 10.0
DRAIN_POLL_S = 0.05
# Celery's own INFO lines for a task's start and end (celery.app.trace, celery.worker.request)
TASK_RECEIVED = re.compile(r"Task \S+\[([^\]]+)\] received")
TASK_ENDED = re.compile(r"Task \S+\[([^\]]+)\] (?:succeeded|raised|retry|failed|ignored|rejected)")


class CeleryWorker:
    """A real ``celery -A tasks worker`` process with its own log file."""

    def __init__(self, queues: str, env: dict[str, str], log_path: Path, *,
                 pool: str = "prefork", concurrency: int = 1, name: str | None = None,
                 loglevel: str = "INFO") -> None:
        self.queues, self.log_path = queues, log_path
        self.name = name or f"{queues.replace(',', '-')}-{os.getpid()}-{time.monotonic_ns()}@test"
        cmd = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", queues,
               "-P", pool, "-c", str(concurrency), "-n", self.name, "-l", loglevel,
               "--without-mingle", "--without-gossip"]
        self.proc = spawn(cmd, env, log_path).proc  # stopped by stop() / kill() below

    def wait_ready(self, app_redis_url: str) -> None:
        """Wait until the worker answers a ping over the broker (its own readiness event)."""
        probe = Celery(broker=app_redis_url, backend=app_redis_url)
        deadline = time.monotonic() + WORKER_READY_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise AssertionError(f"worker exited early:\n{self.log_path.read_text()[-3000:]}")
                replies = probe.control.ping(destination=[self.name], timeout=PING_TIMEOUT_S)
                if replies:
                    return
            raise AssertionError(f"worker {self.name} not ready:\n{self.log_path.read_text()[-3000:]}")
        finally:
            probe.close()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (the main process and its pool children)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        self.proc.wait(WORKER_STOP_TIMEOUT_S)

    def running(self) -> int:
        """Tasks received whose end is not logged yet (by Celery's own lines in this worker's log)."""
        log = self.log()
        left = Counter(TASK_RECEIVED.findall(log))
        left.subtract(Counter(TASK_ENDED.findall(log)))
        return sum(n for n in left.values() if n > 0)

    def stop(self) -> None:
        """Let running tasks end (up to ``WORKER_DRAIN_TIMEOUT_S``); then SIGTERM the main process alone
        if no task runs, else the group; SIGKILL the group after ``WORKER_STOP_TIMEOUT_S``.

        Why wait: without ``REMAP_SIGTERM`` a SIGTERM kills a pool child at once, and a task killed in
        its last lines (its job already final at the counterpart) is logged as a ``WorkerLostError``
        that the test's log budget rightly refuses. Why the main process alone once the log says no
        task runs: a child logs a task's end before the main process reads its result from the pool's
        pipe, and a child killed in between is a lost job to billiard (``WorkerLostError ... Job: 0``
        for a task that succeeded, seen on a loaded box 0.5 s after the child's line). The main process's
        warm shutdown reads the pipe, then ends its children itself. A test that leaves a task held on
        purpose still gets the group SIGTERM after the wait, so that line stays visible."""
        deadline = time.monotonic() + WORKER_DRAIN_TIMEOUT_S
        busy = self.running()
        while self.proc.poll() is None and busy and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL_S)
            busy = self.running()
        if self.proc.poll() is not None:
            return
        if busy:
            stop_group(self.proc, signal.SIGTERM, WORKER_STOP_TIMEOUT_S)
            return
        self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(WORKER_STOP_TIMEOUT_S)
        stop_group(self.proc, signal.SIGKILL, WORKER_STOP_TIMEOUT_S)  # a main process that did not stop

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture()
def celery_workers(tmp_path: Path) -> Iterator[Callable[..., CeleryWorker]]:
    """Factory: ``start(queues, env)`` returns a ready worker; all are stopped at teardown."""
    started: list[CeleryWorker] = []

    def start(queues: str, env: dict[str, str], **kw: object) -> CeleryWorker:
        log_path = tmp_path / f"worker-{len(started)}-{queues.replace(',', '_')}.log"
        worker = CeleryWorker(queues, env, log_path, **kw)  # type: ignore[arg-type]
        started.append(worker)
        worker.wait_ready(env["REDIS_URL"])
        return worker

    yield start
    for worker in started:
        worker.stop()
