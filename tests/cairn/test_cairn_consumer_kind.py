"""A second consumer kind plugs into the bridge: its own stream, its own parser, the same decision point.

The hook the webhook consumer (``cairn.webhooks.<worker_key>.event`` on
``CAIRN_WEBHOOKS``) uses: one more ``(JobConsumer, MessageKind)`` in
``CairnBridge(extra=...)``. A real bridge runs in this process against a real
nats-server and Redis; the task sender it is given plays the pool the way
``run_job`` does (take the lease, record the outcome, release, store the
Celery result), so the bridge's whole path is exercised: admission with the
kind's parser, dispatch, the outcome, the ack — and poison on that stream is
termed on its own keys.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import nats
import pytest
import redis
from celery import Celery, states
from nats.js.api import RetentionPolicy, StreamConfig

from bridges.cairn.admission import MessageKind, decode_object
from bridges.cairn.bridge import CairnBridge, TaskSenders
from bridges.cairn.consumers import JobConsumer
from tasks.hardening.result_backend import result_backend_url
from workers.cairn.contract.subjects import JOBS_STREAM, WEBHOOKS_STREAM
from workers.cairn.disposition import ack
from workers.cairn.outcomes import LEASE_NAMESPACE, MessageKey, OutcomeLedger
from workers.cairn.settings import CairnSettings
from workers.lease import Leases

KIND = "webhook_event"
SETTLE_WITHIN_S = 20.0
LEASE_TTL_S = 5.0


class Pool:
    """The task side of the test: what ``run_job`` does for a job, in its order."""

    def __init__(self, app: Celery, url: str) -> None:
        self.app = app
        self.client = redis.Redis.from_url(url)
        self.leases = Leases(self.client, LEASE_NAMESPACE)
        self.ran: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

    def job(self, kind: str, job: dict[str, Any], meta: dict[str, Any], task_id: str) -> None:
        self.ran.append((kind, job, meta))
        key = MessageKey.from_meta(meta)
        running = self.leases.take(key.id, meta["lease_token"], LEASE_TTL_S)
        assert running is not None
        OutcomeLedger(self.client).record(key, ack())
        self.leases.release(key.id, running)
        self.app.backend.store_result(task_id, ack().model_dump(), states.SUCCESS)

    def unused(self, arg: Any, task_id: str, expires_s: float) -> None:
        raise AssertionError("no discover/exchange in this test")


def test_a_webhook_consumer_on_its_own_stream_goes_through_the_same_admission(
        nats_url: str, fresh_redis: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pool_name = f"hook-{uuid.uuid4().hex[:6]}"
    worker_key = f"{pool_name}-strava"
    subject = f"cairn.webhooks.{worker_key}.event"
    monkeypatch.setenv("REDIS_URL", fresh_redis)  # read by RedisSettings, the one reader of REDIS_URL
    settings = CairnSettings(nats_url=nats_url, worker_name=pool_name, release="dev", ack_wait_s=2.0)
    app = Celery("consumer-kind", broker=fresh_redis, backend=result_backend_url(fresh_redis))  # the fleet's backend
    pool = Pool(app, fresh_redis)
    webhook = MessageKind(KIND, parse=decode_object)  # the webhooks engineer's parser goes here
    consumer = JobConsumer(KIND, subject, f"{pool_name}_webhook_event", WEBHOOKS_STREAM)
    bridge = CairnBridge(settings, TaskSenders(pool.job, pool.unused, pool.unused), app.backend,
                         extra=[(consumer, webhook)])

    async def scenario() -> dict[str, Any]:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        for name, subjects in ((JOBS_STREAM, ["cairn.jobs.>"]), (WEBHOOKS_STREAM, ["cairn.webhooks.>"])):
            try:
                await js.add_stream(StreamConfig(name=name, subjects=subjects, retention=RetentionPolicy.WORK_QUEUE))
            except Exception:  # noqa: BLE001 - exists from another test of the session
                pass
        run = asyncio.create_task(bridge.run())
        try:
            while not hasattr(bridge, "responders") or not bridge.responders._subs:
                await asyncio.sleep(0.05)  # started: the bridge has no other start signal in-process
            good = await js.publish(subject, json.dumps({"owner_id": 42, "aspect_type": "create"}).encode())
            await js.publish(subject, b"[" * 100_000 + b"]" * 100_000)
            deadline = asyncio.get_running_loop().time() + SETTLE_WITHIN_S
            while asyncio.get_running_loop().time() < deadline:
                info = await js.consumer_info(WEBHOOKS_STREAM, consumer.durable)
                if info.num_ack_pending == 0 and info.num_pending == 0 and pool.ran:
                    break
                await asyncio.sleep(0.1)
            return {"info": await js.consumer_info(WEBHOOKS_STREAM, consumer.durable), "seq": good.seq}
        finally:
            bridge.stop()
            await run
            await nc.close()

    out = asyncio.run(scenario())
    assert out["info"].num_ack_pending == 0 and out["info"].num_pending == 0  # both settled
    ((kind, job, meta),) = pool.ran  # the good one dispatched once, the poison never
    assert kind == KIND and job == {"owner_id": 42, "aspect_type": "create"}
    assert meta["stream"] == WEBHOOKS_STREAM and meta["seq"] == out["seq"]  # keys name the stream
    r = redis.Redis.from_url(fresh_redis)
    assert not list(r.scan_iter("sy:cairn:outcome:*"))  # the ledger entry went with the ack
