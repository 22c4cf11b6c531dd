"""The Cairn bridge's building blocks against real services (nats-server, Redis).

The end-to-end behaviour (real bridge process, real Celery workers, dev core,
fake Strava) is in ``test_cairn_e2e.py``; here are the pieces whose rules are
easier to pin one by one: release compatibility, durable consumers and their
MaxDeliver, the failed-delivery count and the NAK delays, the result waiter on
the Redis backend's pub/sub.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nats
import pytest
import redis
import redis.asyncio as aioredis
from celery import Celery, states
from nats.js.api import RetentionPolicy, StreamConfig

from bridges.cairn.admission import gives_up
from bridges.cairn.consumers import STREAM_JOBS, consumer_config, ensure_consumers, job_consumers
from bridges.cairn.results import TaskResults
from bridges.cairn.settle import FAILURE_COUNT_TTL_S, FailureCounts, Held, settle
from ops.cairn_check import subject_matches
from tasks.hardening.result_backend import result_backend_url
from tests.kit.cairn_ctx import core_bucket
from workers.cairn.compat import IncompatibleCoreError, check_core_release, compatible, decode_info, is_dev_build
from workers.cairn.disposition import MIN_NAK_DELAY_S, ack, nak
from workers.cairn.handlers.discover import valid_discover_reply
from workers.cairn.outcomes import FAILURES_PREFIX
from workers.cairn.settings import CairnSettings, load_cairn_settings
from workers.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
EXIT_CONFIG_ERROR = 2  # bridges.__main__


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
    with pytest.raises(IncompatibleCoreError, match="^core release 'seven'"):  # names the right side
        compatible("v0.7.0", "seven")


@pytest.mark.parametrize("release", ["dev", "dev-abc123", "dev.3", "dev+g1", "v0.8.0-dev.3", "v0.9.0+dev",
                                     "v0.8.0-rc.1+dev.2"])
def test_a_dev_build_the_settings_accept_is_exempt_on_either_side(release: str) -> None:
    """One rule: what CAIRN_RELEASE accepts as a dev build, the core check exempts, ours or core's."""
    assert CairnSettings(release=release).release == release
    assert is_dev_build(release)
    assert compatible(release, "v0.1.0") and compatible("v0.7.0", release)


def test_a_pre_release_is_not_a_dev_build() -> None:
    assert CairnSettings(release="v0.8.0-rc.1").release == "v0.8.0-rc.1"
    assert not is_dev_build("v0.8.0-rc.1") and not is_dev_build("v0.8.0+gdev1")
    assert not compatible("v0.8.0-rc.1", "v0.7.0")
    with pytest.raises(ValueError, match="dev build"):
        CairnSettings(release="seven")


def test_max_deliver_is_unlimited_by_default_and_a_finite_one_must_exceed_the_term(
        monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = CairnSettings()
    assert defaults.max_deliver == -1 and defaults.term_after_deliveries == 5
    monkeypatch.setenv("CAIRN_TERM_AFTER_DELIVERIES", "8")
    monkeypatch.setenv("CAIRN_MAX_DELIVER", "12")
    assert load_cairn_settings().max_deliver == 12
    monkeypatch.setenv("CAIRN_MAX_DELIVER", "8")  # above the default 5, not above the configured 8
    with pytest.raises(ConfigError, match=r"CAIRN_MAX_DELIVER: .*CAIRN_TERM_AFTER_DELIVERIES \(8\)"):
        load_cairn_settings()
    monkeypatch.setenv("CAIRN_MAX_DELIVER", "0")
    with pytest.raises(ConfigError, match="CAIRN_MAX_DELIVER"):
        load_cairn_settings()


@pytest.mark.slow
def test_a_bad_max_deliver_stops_the_bridge_at_start_naming_the_variable() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env |= {"CAIRN_MAX_DELIVER": "4", "CAIRN_NATS_URL": "nats://127.0.0.1:1"}  # 4 <= the default 5
    done = subprocess.run([sys.executable, "-m", "bridges", "cairn"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == EXIT_CONFIG_ERROR, done.stderr[-2000:]
    assert "invalid configuration: CAIRN_MAX_DELIVER" in done.stderr
    assert "CAIRN_TERM_AFTER_DELIVERIES (5)" in done.stderr
    assert "cairn bridge started" not in done.stderr


def test_the_term_counts_failures_not_deliveries() -> None:
    """With 5, a job that failed 4 times is termed on arrival (its 5th delivery if every one failed)."""
    assert not gives_up(0, 5) and not gives_up(3, 5) and gives_up(4, 5) and gives_up(9, 5)
    assert gives_up(0, 1)  # CAIRN_TERM_AFTER_DELIVERIES=1: no retry at all


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
            kv = await core_bucket(js, bucket)
            assert await check_core_release(js, "v0.7.0") is None  # no info: warn and run
            await kv.put("info", json.dumps({"release": "v0.7.4"}).encode())
            assert await check_core_release(js, "v0.7.0") == "v0.7.4"
            await kv.put("info", b"v0.8.0")
            with pytest.raises(IncompatibleCoreError, match="v0.8.0"):
                await check_core_release(js, "v0.7.0")
            assert await check_core_release(js, "dev") == "v0.8.0"
            assert await check_core_release(js, "dev-abc123") == "v0.8.0"  # was refused, blaming core
            await kv.put("info", b"dev.3")
            assert await check_core_release(js, "v0.7.0") == "dev.3"
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


def test_consumer_max_deliver_follows_the_setting_on_every_restart(nats_url: str) -> None:
    """MaxDeliver is sent explicitly, -1 included, and create-or-update applies a change to a durable."""
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    consumers = job_consumers(pool, [("fetch_source", f"cairn.jobs.fetch_source.strava.{pool}")])
    assert consumer_config(consumers[0], 30.0, -1).as_dict()["max_deliver"] == -1

    async def scenario() -> None:
        nc, js = await _js(nats_url)
        try:
            for max_deliver in (CairnSettings().max_deliver, 12, -1):  # default, an operator's value, back
                await ensure_consumers(js, consumers, 30.0, max_deliver)
                info = await js.consumer_info(STREAM_JOBS, consumers[0].durable)
                assert info.config.max_deliver == max_deliver
        finally:
            await nc.close()
    _run(scenario())


def test_failed_naks_are_counted_waits_are_not_and_no_nak_is_instant(nats_url: str, fresh_redis: str) -> None:
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    subject = f"cairn.jobs.fetch_source.strava.{pool}"
    (consumer,) = job_consumers(pool, [("fetch_source", subject)])

    async def scenario() -> None:
        nc, js = await _js(nats_url)
        r = aioredis.Redis.from_url(fresh_redis)
        counts = FailureCounts(r)
        try:
            await ensure_consumers(js, [consumer], 30.0, -1)
            sub = await js.pull_subscribe_bind(durable=consumer.durable, stream=STREAM_JOBS)
            ack_ = await js.publish(subject, b"{}")
            # A recreated stream reuses sequences: a count left under this seq by an earlier
            # incarnation (another stream timestamp) must not count against this message.
            await r.set(f"{FAILURES_PREFIX}{STREAM_JOBS}:{ack_.seq}:0.000000", 4)

            async def deliver() -> Held:
                (msg,) = await sub.fetch(1, timeout=10)
                held = Held(consumer, msg, msg.metadata.num_delivered, msg.metadata.sequence.stream)
                held.failures = await counts.count(held)
                return held

            held = await deliver()
            await settle(held, nak(None, "rate_limited: short window", failure=False), counts, 5)
            naked = time.monotonic()
            held = await deliver()
            assert time.monotonic() - naked >= MIN_NAK_DELAY_S * 0.9  # a NAK without delay still waits
            assert (held.delivery, held.failures) == (2, 0)  # a rate-limit wait is not a failure
            await settle(held, nak(0.1, "transient: HTTP 500"), counts, 5)
            held = await deliver()
            assert (held.delivery, held.failures) == (3, 1)
            assert 0 < await r.ttl(counts.key(held)) <= FAILURE_COUNT_TTL_S
            await settle(held, nak(0.1, "lease expired: task lost"), counts, 5)
            held = await deliver()
            assert (held.delivery, held.failures) == (4, 2)
            await settle(held, ack(), counts, 5)
            assert not await r.exists(counts.key(held))  # deleted with the ack
        finally:
            await r.aclose()
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
    app = Celery("waiter-test", broker=fresh_redis, backend=result_backend_url(fresh_redis))  # the fleet's backend

    async def scenario() -> None:
        results = TaskResults(app.backend, fresh_redis)
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


def test_the_pools_job_results_are_heard_through_one_pattern_also_across_a_lost_connection(
        fresh_redis: str) -> None:
    """A job's watch costs no SUBSCRIBE/GET/UNSUBSCRIBE (issue 15 §3): the pool's task ids are covered
    by one pattern subscribed before any is sent; a result published while the connection was lost
    is read once the connection is replaced, as for any watched key."""
    app = Celery("waiter-pattern", broker=fresh_redis, backend=result_backend_url(fresh_redis))
    client = redis.Redis.from_url(fresh_redis)

    async def scenario() -> None:
        results = TaskResults(app.backend, fresh_redis, covered="cairn-pool-a-")
        try:
            await results.start()
            job = f"cairn-pool-a-7-d1-{uuid.uuid4().hex[:8]}"
            watch = await results.watch(job)
            key = app.backend.get_key_for_task(job)
            assert client.pubsub_numsub(key) == [(key, 0)] and client.pubsub_numpat() == 1
            await asyncio.to_thread(app.backend.store_result, job, {"action": "ack"}, states.SUCCESS)
            assert (await asyncio.wait_for(watch.done, 5.0))["result"] == {"action": "ack"}
            await results.forget(watch)

            other = f"discover-pool-a-{uuid.uuid4().hex}"  # not a job: a subscription of its own
            assert (await results.watch(other)) is not None
            assert client.pubsub_numsub(app.backend.get_key_for_task(other))[0][1] == 1

            lost = f"cairn-pool-a-8-d1-{uuid.uuid4().hex[:8]}"
            watch = await results.watch(lost)
            client.client_kill_filter(_type="pubsub")  # the one pub/sub connection drops
            await asyncio.to_thread(app.backend.store_result, lost, {"action": "nak"}, states.SUCCESS)
            assert (await asyncio.wait_for(watch.done, 15.0))["result"] == {"action": "nak"}
        finally:
            await results.close()
    _run(scenario())
