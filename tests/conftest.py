"""Session fixtures: real services on loopback, real Celery worker processes.

Nothing here mocks a component we own. Redis, nats-server and moto S3 run as
real servers on free ports (``deploy.devstack.services``); Celery workers run
as real ``celery -A tasks worker`` processes so SIGKILL tests kill something real.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deploy.devstack import log_budget as budget
from deploy.devstack import services
from deploy.devstack.procs import spawn, stop_group

WORKER_READY_TIMEOUT_S = 60.0
WORKER_STOP_TIMEOUT_S = 15.0


@pytest.fixture(scope="session")
def redis_service() -> Iterator[services.Service]:
    with services.redis_server() as svc:
        yield svc


@pytest.fixture(scope="session")
def redis_url(redis_service: services.Service) -> str:
    return redis_service.url


@pytest.fixture(scope="session")
def nats_service() -> Iterator[services.Service]:
    with services.nats_server() as svc:
        yield svc


@pytest.fixture(scope="session")
def nats_url(nats_service: services.Service) -> str:
    return nats_service.url


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    with services.moto_s3() as svc:
        yield svc.url


@pytest.fixture()
def fresh_redis(redis_url: str) -> Iterator[str]:
    """The session Redis, flushed before the test so state never leaks between tests."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushall()
    yield redis_url
    client.close()


@pytest.fixture()
def http_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Capture everything, httpx and httpcore included, at DEBUG (S1 checks read this).

    Named explicitly because the fleet's logging setup quiets httpx: a secret check
    over a capture that never saw httpx's request lines would prove nothing.
    """
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpcore"):
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


@pytest.fixture()
def log_budget(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[budget.Allow]]:
    """H1's log budget for a test that starts fleet processes logging under ``tmp_path``.

    After the test (and, used through ``pytest.mark.usefixtures`` or as the first
    argument, after the fixtures that stop its processes), every ``*.log`` under
    ``tmp_path`` is read: any WARNING, ERROR or traceback that neither the
    baseline, nor an entry of the module's ``LOG_BUDGET_ALLOW`` whose
    ``provoked_by`` names this test, nor an entry the test appended to the
    yielded list explains fails the test, naming the line. An entry applies only
    to the test that provokes it: the same line in another test is a finding.
    """
    test = request.node.originalname
    allow = [*budget.baseline(),
             *(e for e in getattr(request.module, "LOG_BUDGET_ALLOW", ()) if test in e.provoked_by.split())]
    yield allow
    budget.check([tmp_path], allow)


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str,
               interval_s: float = 0.05) -> object:
    """Poll ``predicate`` until truthy. Only for state that has no event to await."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


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
                replies = probe.control.ping(destination=[self.name], timeout=0.5)
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
