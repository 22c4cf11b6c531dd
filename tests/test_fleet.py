"""The fleet-wide backlog limit holds whatever the number of bridges (real Redis)."""

from __future__ import annotations

import threading

import redis

from workers.voicy.fleet import Fleet, HeldJob


def test_backlog_reservations_never_exceed_the_limit_across_instances(fresh_redis: str) -> None:
    fleets = [Fleet(redis.Redis.from_url(fresh_redis)) for _ in range(4)]
    limit = 5
    slots: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(fleets))

    def bridge(fleet: Fleet) -> None:
        barrier.wait()
        for _ in range(10):
            slot = fleet.reserve_backlog(limit)
            if slot:
                with lock:
                    slots.append(slot)

    threads = [threading.Thread(target=bridge, args=(f,)) for f in fleets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(slots) == limit
    assert fleets[0].backlog_size() == limit


def test_filled_slot_stays_until_the_job_leaves_and_cancelled_slot_frees(fresh_redis: str) -> None:
    fleet = Fleet(redis.Redis.from_url(fresh_redis))
    a = fleet.reserve_backlog(2)
    b = fleet.reserve_backlog(2)
    assert a and b and fleet.reserve_backlog(2) is None
    fleet.fill_backlog(a, "job-a")
    fleet.cancel_backlog(b)
    assert fleet.backlog_size() == 1
    fleet.hold(HeldJob(job_id="job-a"))
    assert fleet.is_held("job-a") and fleet.held_ids() == ["job-a"]
    fleet.leave_backlog("job-a")
    assert fleet.backlog_size() == 0
    fleet.forget("job-a")
    assert not fleet.is_held("job-a") and fleet.get("job-a") is None
