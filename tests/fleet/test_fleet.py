"""The fleet-wide backlog limit holds whatever the number of bridges, and a claim is adopted whole (real Redis)."""

from __future__ import annotations

import threading

import redis

from workers.voicy.fleet import Fleet, HeldJob, Stage

LEASE_TTL_S = 2.0


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
    r = redis.Redis.from_url(fresh_redis)
    fleet = Fleet(r)
    a = fleet.reserve_backlog(2)
    b = fleet.reserve_backlog(2)
    assert a and b and fleet.reserve_backlog(2) is None
    # one transaction: the slot becomes the job's, the job is held, its lease granted
    fleet.adopt(HeldJob(job_id="job-a", attempts=1), slot=a, gpu=False, lease_key="sy:lease:test:job-a",
                lease_value="granted:t", lease_ttl_s=LEASE_TTL_S)
    fleet.cancel_backlog(b)
    assert fleet.backlog_size() == 1
    assert fleet.is_held("job-a") and fleet.held_ids() == ["job-a"]
    held = fleet.get("job-a")
    assert held and held.attempts == 1 and held.stage is Stage.CLAIMED and held.claimed_at > 0
    assert r.get("sy:lease:test:job-a") == b"granted:t"
    assert 0 < r.pttl("sy:lease:test:job-a") <= LEASE_TTL_S * 1000
    assert fleet.gpu_load() == 0  # a download takes its gpu slot only when its transcription is sent
    fleet.leave_backlog("job-a")
    assert fleet.backlog_size() == 0
    fleet.forget("job-a")
    assert not fleet.is_held("job-a") and fleet.get("job-a") is None


def test_a_recovered_job_is_adopted_onto_the_gpu_without_a_backlog_slot(fresh_redis: str) -> None:
    r = redis.Redis.from_url(fresh_redis)
    fleet = Fleet(r)
    fleet.adopt(HeldJob(job_id="job-r", media_key="job-r.ogg"), slot=None, gpu=True,
                lease_key="sy:lease:test:job-r", lease_value="granted:t", lease_ttl_s=LEASE_TTL_S)
    assert fleet.held_ids() == ["job-r"] and fleet.gpu_load() == 1 and fleet.backlog_size() == 0
    held = fleet.get("job-r")
    assert held and held.media_key == "job-r.ogg"
