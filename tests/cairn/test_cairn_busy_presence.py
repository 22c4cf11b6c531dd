"""Presence while every slot of a pool runs a long job (contract §2: every ~20 s, fresh for 45 s).

A presence *task* would wait for a free slot, so a provider worker at ``-c 1``
holding a job longer than core's freshness window would look dead to core.
The worker's main process renews the record on its own timer
(``PresenceTimer``, ``tasks.presence``), never waiting for a slot. Here the
interval is 1 s (``CAIRN_PRESENCE_INTERVAL_S``), no beat runs, and the fake
Strava's gate holds the only slot's job: the records keep coming during the hold.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from tests.kit.cairn_stack import WAIT_S, CairnStack
from tests.kit.waiting import wait_until
from workers.cairn.presence import PresenceTimer

# slow: starts fleet processes (tests/kit/fleet_guard.py); one xdist worker runs the module, whose
# module-scoped stack is then started once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cairn_busy_presence")]

INTERVAL_S = 1.0
HELD_WRITES = 2  # fresh records to see while the job is held


def test_the_timer_writes_at_start_and_every_interval_and_survives_failures(
        caplog: pytest.LogCaptureFixture) -> None:
    """Driven by hand (``beat()``): a failure is logged once per outage and never raised."""
    caplog.set_level(logging.INFO, logger="workers.cairn.presence")
    calls: list[int] = []
    outcomes = iter([{"ok": 1}, ConnectionError("nats down"), TimeoutError(), {"ok": 2}, None])

    def write() -> object:
        calls.append(1)
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    timer = PresenceTimer(write, 20.0)
    assert timer.beat() and timer.writes == 1
    assert not timer.beat() and not timer.beat()  # NATS away: no exception escapes
    assert timer.beat() and timer.writes == 2  # back: written again
    assert not timer.beat() and timer.writes == 2  # an incompatible core: the writer wrote nothing
    failures = [r for r in caplog.records if "presence write failed" in r.getMessage()]
    assert len(failures) == 1 and len(calls) == 5
    assert any("presence written again" in r.getMessage() for r in caplog.records)


def test_the_timer_thread_writes_at_once_then_on_its_interval_until_stopped() -> None:
    third = threading.Event()
    count: list[int] = []

    def write() -> object:
        count.append(1)
        if len(count) == 3:
            third.set()
        return {}

    timer = PresenceTimer(write, 0.05)
    timer.start()
    try:
        assert third.wait(WAIT_S), "the timer did not keep writing"
    finally:
        timer.stop()
    assert timer._thread is not None and not timer._thread.is_alive()


def test_the_timer_renews_the_manifest_at_start_then_once_per_manifest_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    """The manifest rides on the presence thread (no beat task: beat knows no pool): written at once,
    then only when its interval has passed; a failed or gated write is tried on the next tick."""
    caplog.set_level(logging.INFO, logger="workers.cairn.presence")
    outcomes = iter([ConnectionError("nats down"), None, {"ok": 1}, {"ok": 2}])
    calls: list[int] = []

    def manifest() -> object:
        calls.append(1)
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    timer = PresenceTimer(lambda: {}, 20.0, manifest=manifest, manifest_interval_s=3600.0)
    assert not timer.renew_manifest()  # NATS away: no exception escapes, due again next tick
    assert not timer.renew_manifest()  # an incompatible core: nothing written, still due
    assert timer.renew_manifest() and timer.manifests == 1
    assert not timer.renew_manifest() and len(calls) == 3  # written: not due for an hour
    assert timer.renew_manifest(now=True) and timer.manifests == 2  # the control command asks now
    assert len([r for r in caplog.records if "manifest write failed" in r.getMessage()]) == 1
    assert any("manifest written again" in r.getMessage() for r in caplog.records)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    s = CairnStack(tmp_path_factory.mktemp("cairn-busy"), redis_url, s3_endpoint,
                   extra_env={"CAIRN_PRESENCE_INTERVAL_S": str(INTERVAL_S)}).start()
    try:
        s.start_worker(concurrency=1)
        s.start_bridge()
        yield s
    finally:
        s.stop()


def test_a_pool_whose_only_slot_runs_a_long_job_stays_present(stack: CairnStack) -> None:
    (worker,) = stack.workers
    key = f"{stack.pool}.{worker.name.replace('@', '-')}"
    wait_until(lambda: key in stack.core.presence(stack.pool), WAIT_S, "the start-up presence record")
    acct = stack.connect_athlete()
    job = stack.fetch_job(acct, stack.first_activity_id(acct))
    stack.hold_at_the_gate(job)
    seen = [stack.core.presence(stack.pool)[key]["last_seen"]]
    try:
        for _ in range(HELD_WRITES):
            seen.append(wait_until(lambda: (stack.core.presence(stack.pool)[key]["last_seen"]
                                            if stack.core.presence(stack.pool)[key]["last_seen"] > seen[-1]
                                            else None), WAIT_S, "a fresh presence record during the held job"))
        assert not stack.results_for(job["job_id"])  # still held: the records came during the job
    finally:
        stack.gate.open()
    stack.core.router.wait(lambda: bool(stack.results_for(job["job_id"])), WAIT_S, "the job's result")
    assert len(seen) == HELD_WRITES + 1 and seen == sorted(seen)
