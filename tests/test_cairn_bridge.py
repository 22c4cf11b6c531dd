"""The Cairn bridge's building blocks against real services (nats-server, Redis).

The end-to-end behaviour (real bridge process, real Celery workers, dev core,
fake Strava) is in ``test_cairn_e2e.py``; here are the pieces whose rules are
easier to pin one by one: release compatibility, durable consumers, the
result waiter on the Redis backend's pub/sub.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import nats
import pytest
from celery import Celery, states
from nats.js.api import RetentionPolicy, StreamConfig

from bridges.cairn_check import subject_matches, valid_discover_reply
from bridges.cairn_pool import (STREAM_JOBS, IncompatibleCoreError, check_core_release, compatible,
                                decode_info, ensure_consumers, is_dev_build, job_consumers)
from workers.cairn.settings import CairnSettings
from bridges.cairn_results import TaskResults


# ------------------------------------------------------------------ release compatibility
@pytest.mark.parametrize(("worker", "core", "ok"), [
    ("v0.7.0", "v0.7.0", True),
    ("v0.7.3", "v0.7.0", True),   # patch levels are free before 1.0
    ("v0.7.0", "v0.8.0", False),  # pre-1.0: minor must match
    ("v0.7.0", "v0.6.9", False),
    ("v1.1.4", "v1.3.0", True),   # from 1.0: worker minor not above core's
    ("v1.4.0", "v1.3.0", False),
    ("v2.0.0", "v1.9.0", False),
    ("dev", "v0.9.0", True),      # dev builds are exempt, either side
    ("v0.7.0", "v0.9.0-dev.2", True),
    ("v0.7.0-dev", "v0.1.0", True),
])
def test_release_compatibility(worker: str, core: str, ok: bool) -> None:
    assert compatible(worker, core) is ok


def test_release_parsing() -> None:
    assert decode_info(b'{"release": "v0.7.0", "commit": "abc"}') == "v0.7.0"
    assert decode_info(b"v0.7.1") == "v0.7.1"
    assert decode_info(b'"v0.7.2"') == "v0.7.2"
    assert is_dev_build("dev") and is_dev_build("v0.8.0-dev.1") and not is_dev_build("v0.8.0")
    with pytest.raises(IncompatibleCoreError):
        compatible("v0.7.0", "seven")


def test_max_deliver_is_a_backstop_above_our_own_term() -> None:
    defaults = CairnSettings()
    assert defaults.max_deliver > defaults.term_after_deliveries == 5


# ------------------------------------------------------------------ JetStream
def _run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def _js(nats_url: str):  # type: ignore[no-untyped-def]
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        await js.add_stream(StreamConfig(name=STREAM_JOBS, subjects=["cairn.jobs.>"],
                                         retention=RetentionPolicy.WORK_QUEUE))
    except Exception:  # noqa: BLE001 - exists from another test of the session
        pass
    return nc, js


def test_core_release_check(nats_url: str) -> None:
    async def scenario() -> None:
        nc, js = await _js(nats_url)
        bucket = "cairn_core"
        try:
            try:
                await js.delete_key_value(bucket)
            except Exception:  # noqa: BLE001
                pass
            assert await check_core_release(js, "v0.7.0") is None  # no bucket: warn and run
            kv = await js.create_key_value(bucket=bucket)
            assert await check_core_release(js, "v0.7.0") is None  # no info: warn and run
            await kv.put("info", json.dumps({"release": "v0.7.4"}).encode())
            assert await check_core_release(js, "v0.7.0") == "v0.7.4"
            await kv.put("info", b"v0.8.0")
            with pytest.raises(IncompatibleCoreError, match="v0.8.0"):
                await check_core_release(js, "v0.7.0")
            assert await check_core_release(js, "dev") == "v0.8.0"
        finally:
            await nc.close()
    _run(scenario())


def test_consumers_are_shared_durables_created_idempotently(nats_url: str) -> None:
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    subjects = [(k, f"cairn.jobs.{k}.strava.{pool}") for k in ("fetch_source", "reconcile")]
    consumers = job_consumers(pool, subjects)
    assert len({c.durable for c in consumers}) == 2
    assert all("." not in c.durable and pool in c.durable for c in consumers)

    async def scenario() -> None:
        nc, js = await _js(nats_url)
        try:
            await ensure_consumers(js, consumers, 30.0, 10)
            await ensure_consumers(js, consumers, 30.0, 10)  # a second instance / a restart
            await ensure_consumers(js, consumers, 12.0, 8)  # changed AckWait is applied, not ignored
            for c in consumers:
                info = await js.consumer_info(STREAM_JOBS, c.durable)
                assert info.config.filter_subject == c.subject
                assert info.config.ack_wait == 12.0
                assert info.config.max_deliver == 8
        finally:
            await nc.close()
    _run(scenario())


# ------------------------------------------------------------------ conformance helpers
def test_subject_matching_like_the_go_harness() -> None:
    s = "cairn.jobs.reconcile.garmin.pool"
    assert subject_matches(s, s)
    assert subject_matches("cairn.jobs.reconcile.*.pool", s)
    assert subject_matches("cairn.jobs.>", s)
    assert not subject_matches("cairn.jobs.fetch_source.garmin.pool", s)
    assert not subject_matches("cairn.jobs.reconcile.garmin", s)
    assert not subject_matches(s + ".extra", s)


@pytest.mark.parametrize(("reply", "ok"), [
    ({"items": [{"item_type": "activity", "external_id": "1", "item_time": "2026-01-01T00:00:00Z"}],
      "next_page": 2}, True),
    ({"items": [], "complete": True}, True),
    ({"error": "no credentials for account"}, True),
    ({"items": [], "rate_limited": True, "next_page": 3}, True),
    ({"rate_limited": True}, False),
    ({"items": None}, False),
    ({"unrelated": True}, False),
    ("not json", False),
])
def test_discover_reply_shapes(reply: object, ok: bool) -> None:
    assert valid_discover_reply(reply) is ok


# ------------------------------------------------------------------ result waiter
def test_task_results_arrive_by_pubsub_also_when_stored_before_watching(fresh_redis: str) -> None:
    app = Celery("waiter-test", broker=fresh_redis, backend=fresh_redis)

    async def scenario() -> None:
        results = TaskResults(app, fresh_redis)
        try:
            early = f"early-{uuid.uuid4().hex}"
            await asyncio.to_thread(app.backend.store_result, early, {"action": "ack"}, states.SUCCESS)
            watch = await results.watch(early)
            meta = await asyncio.wait_for(watch.done, 2.0)
            assert meta["result"] == {"action": "ack"}

            late = f"late-{uuid.uuid4().hex}"
            watch = await results.watch(late)
            assert not watch.started.is_set()
            await asyncio.to_thread(app.backend.store_result, late, None, states.STARTED)
            await asyncio.wait_for(watch.started.wait(), 2.0)
            assert not watch.done.done()
            await asyncio.to_thread(app.backend.store_result, late, {"action": "nak"}, states.SUCCESS)
            meta = await asyncio.wait_for(watch.done, 2.0)
            assert meta["status"] == states.SUCCESS and meta["result"] == {"action": "nak"}
            await results.forget(watch)
        finally:
            await results.close()
    _run(scenario())
