"""What ``switchyard health`` reads in Redis about each process: liveness records (H1), on a real Redis.

A record lives for its TTL unless renewed and is gone at once when forgotten;
the renewer keeps renewing through a failed write.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from tests.kit.waiting import wait_until
from workers import liveness

SHORT_TTL_S = 0.3


@pytest.fixture()
def client(fresh_redis: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(fresh_redis)
    yield c
    c.close()


def test_a_record_lives_for_its_ttl_and_is_gone_at_once_when_forgotten(client: redis.Redis) -> None:
    record = liveness.ProcessRecord(role=liveness.WORKER, name="io.1@host", queues=["io"])
    liveness.renew(client, record)
    (read,) = liveness.read(client, liveness.WORKER)
    assert read.queues == ["io"] and read.ok and read.pid == record.pid
    assert liveness.read(client, liveness.VOICY_BRIDGE) == []  # roles do not mix
    liveness.forget(client, liveness.WORKER, "io.1@host")
    assert liveness.read(client, liveness.WORKER) == []
    liveness.renew(client, record, ttl_s=SHORT_TTL_S)
    wait_until(lambda: not liveness.read(client, liveness.WORKER), 5.0, "the record to expire")


def test_a_renewer_keeps_renewing_and_survives_a_failing_write(client: redis.Redis) -> None:
    calls: list[float] = []

    def write() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise redis.ConnectionError("Redis away")  # logged at DEBUG, retried on the next interval
        liveness.renew(client, liveness.ProcessRecord(role=liveness.WORKER, name="n"), ttl_s=1.0)

    renewer = liveness.Renewer(write, interval_s=0.05).start()
    try:
        wait_until(lambda: len(calls) >= 3, 5.0, "three renewals")
    finally:
        renewer.stop()
    assert [r.name for r in liveness.read(client, liveness.WORKER)] == ["n"]
