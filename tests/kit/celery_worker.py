"""A real ``celery -A tasks worker`` process for a test, and the ``celery_workers`` fixture that starts them."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deploy.devstack.procs import spawn, stop_group

WORKER_READY_TIMEOUT_S = 60.0
WORKER_STOP_TIMEOUT_S = 15.0
PING_TIMEOUT_S = 0.5


class CeleryWorker:
    """A real ``celery -A tasks worker`` process with its own log file."""

    def __init__(self, queues: str, env: dict[str, str], log_path: Path, *,
                 pool: str = "prefork", concurrency: int = 1, name: str | None = None) -> None:
        self.queues, self.log_path = queues, log_path
        self.name = name or f"{queues.replace(',', '-')}-{os.getpid()}-{time.monotonic_ns()}@test"
        cmd = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", queues,
               "-P", pool, "-c", str(concurrency), "-n", self.name, "-l", "INFO",
               "--without-mingle", "--without-gossip"]
        self.proc = spawn(cmd, env, log_path).proc  # stopped by stop() / kill() below

    def wait_ready(self, app_redis_url: str) -> None:
        """Wait until the worker answers a ping over the broker (its own readiness event)."""
        from celery import Celery

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

    def stop(self) -> None:
        stop_group(self.proc, signal.SIGTERM, WORKER_STOP_TIMEOUT_S)

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
