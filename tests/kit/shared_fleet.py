"""One Voicy fleet shared by the tests of a module that would each start the same one, and the log budget
kept per test over it.

Why: a fleet process costs about a CPU-second to start (mostly imports), and a gpu worker's child
about one more on its first job (faster-whisper and the model). Tests that each started an identical
io worker, gpu worker and Voicy bridge, ran short jobs on them and stopped them paid that three times
over for the same proof; on the 2-core box ``make test`` is CPU-bound. A shared fleet is started once
per module (the Procfile's own processes: ``celery -A tasks worker`` and ``python -m bridges voicy``,
as the per-test kit starts them) and serves every test that asks for it. A test that signals a process
(SIGTERM, SIGKILL) starts its own of that kind and runs :meth:`SharedVoicyFleet.only` the shared kinds
it keeps, so no shared process takes its work; a test that needs its fleet started in an order of its
own, or other settings, keeps its own fleet.

What a test of a shared fleet may rely on: the members it asked for are up; its own jobs (it filters
the dev Voicy API's records by its job ids: the server and Redis hold earlier tests' finished jobs
too); no fault left over (faults and delays are cleared between tests); every earlier job final (a
test's end waits for that). The fleet has its own Redis server, so another test's ``fresh_redis``
flush never removes the broker's queue bindings under it.

The log budget (H1) stays per test: :meth:`SharedVoicyFleet.attributed` copies what the fleet logged
since the previous check into the test's ``tmp_path`` (``shared-<log>``), where the test's
``log_budget`` reads it with that test's allow-list, so a warning during a test fails that test. The
module's end checks what is left (the stop of the fleet) against the baseline.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devstack.infra import log_budget, services
from devstack.infra.procs import Proc
from devstack.infra.stack import start_bridge
from tests.kit.celery_worker import CeleryWorker
from tests.kit.gate import Gate
from tests.kit.voicy_stack import FINAL, gated_voicy_dev_stack, voicy_dev_stack
from tests.kit.waiting import wait_until

if TYPE_CHECKING:  # imported where used: the dev server and fake pull in the web stack
    from devstack.fakes.telegram import FakeTelegram
    from devstack.fakes.voicy_api import DevVoicyServer

MEMBERS = ("io", "gpu", "bridge")  # the kinds of process a shared fleet may run, one of each
SHARED_LOG_PREFIX = "shared-"  # a slice of a shared fleet's log, in the test's tmp_path
# How long a test's end waits for the fleet to be quiet (every job on the dev Voicy API final): a job the
# test did not wait for (a retryable failure Voicy requeues up to its attempt limit) must not log into the
# next test's share. Not an assertion: a test that failed may leave a job unfinished.
QUIET_TIMEOUT_S = 60.0


@dataclass
class SharedVoicyFleet:
    """A running io worker, gpu worker and Voicy bridge (or the ones of these a module shares), with the dev
    Voicy API and fake Telegram they use."""

    server: DevVoicyServer
    telegram: FakeTelegram
    env: dict[str, str]
    tmp: Path
    io_concurrency: int = 1
    logs: list[Path] = field(default_factory=list)  # every member's log, restarts included, in start order
    running: dict[str, CeleryWorker | Proc] = field(default_factory=dict)
    _checked: dict[Path, int] = field(default_factory=dict)  # bytes of each log already budgeted

    def only(self, *kinds: str) -> None:
        """Run exactly these members: stop the others (a test that starts its own of that kind, to stop or
        kill it, must not have a shared one take its work), start the missing ones and wait until ready."""
        assert set(kinds) <= set(MEMBERS), kinds
        for kind in [k for k in self.running if k not in kinds]:
            self.running.pop(kind).stop()
        for kind in kinds:
            if kind not in self.running:
                self.running[kind] = self._start(kind)

    def _start(self, kind: str) -> CeleryWorker | Proc:
        log = self.tmp / f"{'' if kind == 'bridge' else 'worker-'}{kind}-{len(self.logs)}.log"
        self.logs.append(log)
        if kind == "bridge":
            return start_bridge(self.env, log)
        worker = CeleryWorker(kind, self.env, log, concurrency=self.io_concurrency if kind == "io" else 1)
        worker.wait_ready(self.redis_url)
        return worker

    def stop(self) -> None:
        self.only()

    @property
    def redis_url(self) -> str:
        return self.env["REDIS_URL"]

    def text(self) -> str:
        """Every log of the fleet, whole (from its start), joined."""
        return "".join(p.read_text(errors="replace") for p in self.logs)

    def log_of(self, kind: str) -> str:
        """The whole logs of the member ``kind`` (``io``, ``gpu``, ``bridge``), every start of it."""
        return "".join(p.read_text(errors="replace") for p in self.logs if kind in p.name)

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
def shared_voicy_fleet(tmp: Path, client: str, *, io_concurrency: int = 1, members: tuple[str, ...] = MEMBERS,
                       gate: Gate | None = None, **env_overrides: str) -> Iterator[SharedVoicyFleet]:
    """Start the fleet under ``tmp``: its own Redis, dev Voicy API (behind ``gate``, if given) and fake
    Telegram, and ``members`` (a module whose tests each start one kind at a moment of their own, or kill
    it, leaves that kind out, or has a test call :meth:`SharedVoicyFleet.only`). Stop it on leaving, then
    check the log budget of what no test took."""
    redis_svc = services.start_redis(tmp / "redis")
    try:
        with ExitStack() as stack:
            if gate is None:
                dev = voicy_dev_stack(tmp, redis_svc.url, client, **env_overrides)
            else:
                patch = stack.enter_context(pytest.MonkeyPatch.context())
                dev = gated_voicy_dev_stack(gate, patch, tmp, redis_svc.url, client, **env_overrides)
            server, telegram, env = stack.enter_context(dev)
            fleet = SharedVoicyFleet(server, telegram, env, tmp, io_concurrency)
            try:
                fleet.only(*members)
                yield fleet
            finally:
                fleet.stop()
            rest = tmp / "after-tests"
            rest.mkdir(exist_ok=True)
            log_budget.check(fleet.take_unchecked(rest), log_budget.baseline())
    finally:
        redis_svc.stop()
