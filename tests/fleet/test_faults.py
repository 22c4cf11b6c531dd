"""``workers.faults``: the standing faults the health verdict reads, in Redis (``sy:health:faults``)."""

from __future__ import annotations

import json

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from workers.faults import FAULTS_KEY, clear_fault, read_faults, record_fault


def test_record_read_replace_and_clear(fresh_redis: str) -> None:
    client = redis.Redis.from_url(fresh_redis)
    record_fault(client, "cairn-pool/p", 'NATS refused publish to "a.b"')
    record_fault(client, "cairn-bridge/p", "first")
    record_fault(client, "cairn-bridge/p", "second")  # one fault per component: the latest wins
    raw = client.hget(FAULTS_KEY, "cairn-pool/p")
    assert raw is not None
    stored = json.loads(raw)
    assert set(stored) == {"detail", "at"}  # the field is the component
    faults = read_faults(client)
    assert [(f.component, f.detail) for f in faults] == [("cairn-bridge/p", "second"),
                                                          ("cairn-pool/p", 'NATS refused publish to "a.b"')]
    assert all(f.at.tzinfo is not None for f in faults)
    clear_fault(client, "cairn-pool/p")
    clear_fault(client, "never-recorded")
    assert [f.component for f in read_faults(client)] == ["cairn-bridge/p"]


def test_an_unreadable_record_is_a_fault_and_redis_away_never_raises(fresh_redis: str) -> None:
    client = redis.Redis.from_url(fresh_redis)
    client.hset(FAULTS_KEY, "cairn-pool/broken", "{not json")
    (fault,) = read_faults(client)
    assert fault.component == "cairn-pool/broken" and "unreadable" in fault.detail
    away = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2,
                       retry=Retry(NoBackoff(), 0))  # redis-py 8 retries 10 times by default: seconds of nothing
    assert record_fault(away, "cairn-pool/p", "x").detail == "x"  # reported by its log line; not raised
    clear_fault(away, "cairn-pool/p")
