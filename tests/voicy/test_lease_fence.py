"""An execution confirms its lease with Redis before an irreversible post (R2, V2).

Found by ``python -m bench partitions`` (gpu-link): a gpu host cut off the network
keeps transcribing; its lease keeper's renewals fail (Redis unreachable: "unknown",
not lost, R1), the lease expires, the reaper gives the job to the other gpu host.
When the link heals, the cut host finishes and posts ``/result`` before its keeper's
next renewal could learn the lease is gone, and Voicy accepts it (both hosts share
one worker token): the job's result came from an execution that no longer owned it.
The fence: ``LeaseKeeper.fence()`` renews *now* and says yes only when Redis answers
that the lease is still this execution's.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from bridges.voicy import VoicyBridge
from devstack.infra.stack import AUDIO_DIR, audio_manifest
from tests.kit.voicy_stack import fleet_runtime, voicy_dev_stack
from workers.lease import LeaseKeeper, Leases, new_token
from workers.voicy import pipeline, transcription

LONG_TTL_S = 600.0  # the keeper's own renewals (every TTL/3) never run during these tests
FENCE_TIMEOUT_S = 1.0
STOLEN = "running:other-execution:x"  # what the reaper's new grant, taken by the other host, looks like
STEAL_BOUND_S = 60.0
CALL_BOUND_S = 15.0  # one Redis call past the fence's deadline: redis-py's own retries of a 0.2 s timeout


def _running(leases: Leases, job: str) -> str:
    token = new_token()
    leases.grant(job, token, LONG_TTL_S)
    value = leases.take(job, token, LONG_TTL_S)
    assert value
    return value


def test_fence_confirms_a_lease_that_is_still_ours(fresh_redis: str) -> None:
    leases = Leases(redis.Redis.from_url(fresh_redis), "fence")
    value = _running(leases, "j1")
    with LeaseKeeper(leases, "j1", value, LONG_TTL_S) as keeper:
        assert keeper.fence(FENCE_TIMEOUT_S)
        assert not keeper.lost.is_set()


def test_fence_refuses_a_lease_taken_over_since_the_last_renewal(fresh_redis: str) -> None:
    leases = Leases(redis.Redis.from_url(fresh_redis), "fence")
    value = _running(leases, "j2")
    with LeaseKeeper(leases, "j2", value, LONG_TTL_S) as keeper:
        redis.Redis.from_url(fresh_redis).set(leases.key("j2"), STOLEN)
        assert not keeper.lost.is_set()  # the keeper has not renewed since: it cannot know
        assert not keeper.fence(FENCE_TIMEOUT_S)
        assert keeper.lost.is_set()
    assert leases.holder("j2") == STOLEN  # the new owner's lease is untouched


def test_fence_takes_back_an_expired_lease_nobody_holds(fresh_redis: str) -> None:
    """Absent means it expired with nobody after us (or Redis lost it): set back NX, never over another."""
    leases = Leases(redis.Redis.from_url(fresh_redis), "fence")
    value = _running(leases, "j3")
    with LeaseKeeper(leases, "j3", value, LONG_TTL_S) as keeper:
        redis.Redis.from_url(fresh_redis).delete(leases.key("j3"))
        assert keeper.fence(FENCE_TIMEOUT_S)
    assert leases.holder("j3") == value


def test_fence_says_no_while_redis_does_not_answer() -> None:
    """A partition: Redis never answers (a listener that accepts and stays silent); bounded, then no."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen()
        client = redis.Redis(port=hole.getsockname()[1], socket_timeout=0.2, socket_connect_timeout=0.2,
                             retry=Retry(NoBackoff(), 0))  # the fence retries; redis-py's 10 retries only slow it
        keeper = LeaseKeeper(Leases(client, "fence"), "j4", "running:t:x", LONG_TTL_S)
        started = time.monotonic()
        assert not keeper.fence(FENCE_TIMEOUT_S)
        assert time.monotonic() - started < FENCE_TIMEOUT_S + CALL_BOUND_S  # bounded: no hang


# --------------------------------------------------------------- the transcription's result
@pytest.fixture()
def stack(tmp_path: Path, fresh_redis: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any, Any]]:
    with voicy_dev_stack(tmp_path, fresh_redis, "fence",
                         VOICY_WORKER_LEASE_TTL_MS=str(int(LONG_TTL_S * 1000))) as (server, telegram, env):
        with fleet_runtime(env, monkeypatch) as rt:
            yield server, telegram, rt


@pytest.mark.model
def test_a_transcription_whose_lease_was_taken_over_posts_no_result(stack: tuple[Any, Any, Any]) -> None:
    server, telegram, rt = stack
    item = max(audio_manifest(), key=lambda m: m["duration_s"])
    data = (AUDIO_DIR / item["file"]).read_bytes()
    telegram.add_file("fid-fence", data)
    job_id = server.enqueue_job("fid-fence", file_size=len(data), mime_type="audio/ogg")
    assert VoicyBridge(rt, lambda *a: None, lambda *a: None).cycle() == 1
    token = (rt.leases.holder(job_id) or "").removeprefix("granted:")
    gpu_token = pipeline.run_download(rt, job_id, token)
    assert gpu_token

    def steal_when_transcribing() -> None:
        """The other host takes the job over while this one's keeper cannot see it (no renewal runs)."""
        deadline = time.monotonic() + STEAL_BOUND_S
        while time.monotonic() < deadline:
            if any(r.get("job_id") == job_id and r.get("endpoint") == "transcribe" for r in server.requests):
                rt.redis.set(rt.leases.key(job_id), STOLEN)
                return
            time.sleep(0.01)  # the dev server's request log: no event to await from here

    stealer = threading.Thread(target=steal_when_transcribing)
    stealer.start()
    posted = transcription.run_transcription(rt, job_id, gpu_token)
    stealer.join()
    assert not posted
    assert not [r for r in server.requests if r.get("job_id") == job_id and r.get("endpoint") == "result"]
    assert rt.leases.holder(job_id) == STOLEN
