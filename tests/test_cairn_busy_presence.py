"""Presence while every slot of a pool runs a long job (contract §2: every ~20 s, fresh for 45 s).

Beat's presence broadcast is a task and waits for a free slot; a provider
worker at ``-c 1`` holding a job longer than core's freshness window would
look dead to core. ``BusyPresence`` writes the record from the pool process
itself once a task has run for a presence interval. Here the interval is 1 s
(``CAIRN_PRESENCE_INTERVAL_S``), no beat runs, and the fake Strava's gate holds
the only slot's job: every fresh record during the hold comes from that path.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cairn_stack import WAIT_S, CairnStack
from tests.conftest import wait_until
from workers.cairn.presence import BusyPresence

INTERVAL_S = 1.0
HELD_WRITES = 2  # fresh records to see while the job is held


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_busy_presence_writes_only_for_a_task_longer_than_an_interval_and_not_twice_per_interval() -> None:
    clock, written = Clock(), []
    busy = BusyPresence(written.append, 20.0, clock=clock)
    busy.stop()  # drive check() by hand; the thread would only call it on a timer
    busy.started("short", "inst-a")
    clock.now += 19.0
    assert not busy.check()  # neither the task nor the silence is an interval long yet
    busy.finished("short")
    clock.now += 30.0
    assert not busy.check() and written == []  # silence alone is the beat path's business
    busy.started("long", "inst-a")
    clock.now += 20.0
    assert busy.check() and written == ["inst-a"]
    clock.now += 10.0
    assert not busy.check()  # written half an interval ago
    busy.wrote()  # the beat broadcast got through
    clock.now += 15.0
    assert not busy.check()
    clock.now += 5.0
    assert busy.check() and written == ["inst-a", "inst-a"]
    busy.finished("long")
    clock.now += 60.0
    assert not busy.check()


def test_a_failed_write_is_retried_on_the_next_check() -> None:
    clock, calls = Clock(), []

    def flaky(instance_id: str) -> None:
        calls.append(instance_id)
        if len(calls) == 1:
            raise ConnectionError("nats down")

    busy = BusyPresence(flaky, 20.0, clock=clock)
    busy.stop()
    busy.started("long", "inst-b")
    clock.now += 20.0
    assert not busy.check()
    clock.now += 1.0
    assert busy.check() and calls == ["inst-b", "inst-b"]


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
    assert stack.core is not None
    (worker,) = stack.workers
    key = f"{stack.pool}.{worker.name.replace('@', '-')}"
    wait_until(lambda: key in stack.core.presence(stack.pool), WAIT_S, "the start-up presence record")
    acct = stack.connect_athlete()
    job = stack.fetch_job(acct, stack.first_activity_id(acct))
    stack.gate.arm()
    stack.core.enqueue_job("fetch_source", job)
    assert stack.gate.arrived.wait(WAIT_S), "the job never reached Strava"
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
