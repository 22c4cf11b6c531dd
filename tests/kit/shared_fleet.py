"""One Voicy fleet shared by the tests of a module that would each start the same one, and the log budget
kept per test over it.

Why: a fleet process costs about a CPU-second to start (mostly imports), and a gpu worker's child
about one more on its first job (faster-whisper and the model). Tests that each started an identical
io worker, gpu worker and Voicy bridge, ran short jobs on them and stopped them paid that three times
over for the same proof; on the 2-core box ``make test`` is CPU-bound. A shared fleet is started once
per module (the Procfile's own processes: ``celery -A tasks worker`` and ``python -m bridges voicy``,
as the per-test kit starts them) and serves every test that asks for it; a test that kills, stops or
restarts a fleet process, or needs one absent, keeps its own fleet instead.

What a test of a shared fleet may rely on: the fleet is up; its own jobs (it filters the dev Voicy
API's records by its job ids: the server and Redis hold earlier tests' finished jobs too); no fault
left over (faults are cleared between tests). The fleet has its own Redis server, so another test's
``fresh_redis`` flush never removes the broker's queue bindings under it.

The log budget (H1) stays per test: :meth:`SharedVoicyFleet.attributed` copies what the fleet logged
since the previous check into the test's ``tmp_path`` (``shared-<log>``), where the test's
``log_budget`` reads it with that test's allow-list, so a warning during a test fails that test. The
module's end checks what is left (the stop of the fleet) against the baseline.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.devstack import log_budget, services
from deploy.devstack.procs import Proc
from deploy.devstack.stack import start_bridge
from tests.kit.celery_worker import CeleryWorker
from tests.kit.voicy_stack import FINAL, voicy_dev_stack
from tests.kit.waiting import wait_until

SHARED_LOG_PREFIX = "shared-"  # a slice of a shared fleet's log, in the test's tmp_path
# How long a test's end waits for the fleet to be quiet (every job on the dev Voicy API final): a job the
# test did not wait for (a retryable failure Voicy requeues up to its attempt limit) must not log into the
# next test's share. Not an assertion: a test that failed may leave a job unfinished.
QUIET_TIMEOUT_S = 60.0


@dataclass
class SharedVoicyFleet:
    """A running io worker, gpu worker and Voicy bridge (or the ones of these a module shares), with the dev
    Voicy API and fake Telegram they use."""

    server: Any
    telegram: Any
    env: dict[str, str]
    logs: list[Path]
    _checked: dict[Path, int] = field(default_factory=dict)  # bytes of each log already budgeted

    @property
    def redis_url(self) -> str:
        return self.env["REDIS_URL"]

    def text(self) -> str:
        """Every log of the fleet, whole (from its start), joined."""
        return "".join(p.read_text(errors="replace") for p in self.logs)

    def log_of(self, name: str) -> str:
        """The whole log whose file name contains ``name`` (``io``, ``gpu``, ``bridge``)."""
        (path,) = [p for p in self.logs if name in p.name]
        return path.read_text(errors="replace")

    def take_unchecked(self, dest: Path) -> list[Path]:
        """Copy what each log gained since the last take into ``dest`` (``shared-<log>``); return the copies."""
        copies = []
        for path in self.logs:
            data = path.read_bytes()
            start = self._checked.get(path, 0)
            self._checked[path] = len(data)
            copy = dest / f"{SHARED_LOG_PREFIX}{path.name}"
            copy.write_bytes(data[start:])
            copies.append(copy)
        return copies

    @contextmanager
    def attributed(self, tmp_path: Path) -> Iterator[SharedVoicyFleet]:
        """One test's use of the fleet: no fault left over at its start, and at its end what the fleet
        logged since the previous test's end copied into ``tmp_path`` for the test's own log budget
        (the fleet's start-up lines go to the first test's; a line between two tests to the later one:
        nothing logged goes unread)."""
        with self.server.state.lock:
            self.server.state.faults.clear()
            self.server.state.delays.clear()
        self.telegram.clear_faults()
        try:
            yield self
        finally:
            self.wait_quiet()
            self.take_unchecked(tmp_path)

    def wait_quiet(self, timeout_s: float = QUIET_TIMEOUT_S) -> bool:
        """Whether every job the dev Voicy API holds became final (completed or failed) within ``timeout_s``."""
        jobs = self.server.db.transcriptionjobs
        try:
            wait_until(lambda: jobs.count_documents({"status": {"$nin": list(FINAL)}}) == 0, timeout_s,
                       "the shared fleet to finish every job", interval_s=0.2)
        except AssertionError:
            return False
        return True


@contextmanager
def shared_voicy_fleet(tmp: Path, client: str, *, io_concurrency: int = 1, gpu: bool = True, bridge: bool = True,
                       **env_overrides: str) -> Iterator[SharedVoicyFleet]:
    """Start the fleet under ``tmp`` (its own Redis, dev Voicy API, fake Telegram, the io worker and,
    unless told not to, the gpu worker and the bridge: a module whose tests each start one at a moment
    of their own keeps that one per test); stop it on leaving, then check the log budget of what no
    test took."""
    redis_svc = services.start_redis(tmp / "redis")
    procs: list[CeleryWorker | Proc] = []
    try:
        with voicy_dev_stack(tmp, redis_svc.url, client, **env_overrides) as (server, telegram, env):
            logs: list[Path] = []
            for queue, concurrency in (("io", io_concurrency), ("gpu", 1))[:2 if gpu else 1]:
                logs.append(tmp / f"worker-{queue}.log")
                worker = CeleryWorker(queue, env, logs[-1], concurrency=concurrency)
                procs.append(worker)
                worker.wait_ready(redis_svc.url)
            if bridge:
                logs.append(tmp / "bridge.log")
                procs.append(start_bridge(env, logs[-1]))
            fleet = SharedVoicyFleet(server, telegram, env, logs)
            try:
                yield fleet
            finally:
                for proc in reversed(procs):
                    proc.stop()
                procs.clear()
                rest = tmp / "after-tests"
                rest.mkdir(exist_ok=True)
                remaining = fleet.take_unchecked(rest)
            log_budget.check(remaining, log_budget.baseline())
    finally:
        for proc in reversed(procs):
            proc.stop()
        redis_svc.stop()
