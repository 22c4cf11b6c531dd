"""Streams, KV buckets and core-owned consumers, created as core creates them.

Reference §2.1-§2.3 (CreateOrUpdate at every core start; workers never create
streams), plus the 0.7 ``cairn_core`` bucket with the ``info`` release record.
One deliberate deviation (documented in §2.1 as what a *useful* double does):
CAIRN_WEBHOOKS captures only ``cairn.webhooks.*.event``, so the ``.verify``
request/reply subject does not also get a JetStream PubAck; pass
``faithful_webhooks=True`` for the published ``cairn.webhooks.>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    ObjectStoreConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError

from workers.cairn.contract import subjects

MINUTE_S = 60.0
HOUR_S = 3600.0
DAY_S = 86400.0

STREAM_JOBS = subjects.JOBS_STREAM
STREAM_RESULTS = subjects.RESULTS_STREAM
STREAM_EVENTS = subjects.EVENTS_STREAM
STREAM_DLQ = subjects.DLQ_STREAM
STREAM_WEBHOOKS = subjects.WEBHOOKS_STREAM

KV_PRESENCE = subjects.PRESENCE_BUCKET
KV_MANIFESTS = subjects.MANIFEST_BUCKET
KV_RATE_LIMITS = subjects.RATE_LIMIT_BUCKET
KV_CORE = subjects.CORE_BUCKET
KV_CORE_INFO_KEY = subjects.CORE_INFO_KEY
# LOCAL (not in workers/cairn/contract/subjects.py: workers never touch them): core-only buckets.
KV_BLOB_HANDLES = "cairn_blob_handles"
OBJECT_STORE_TRANSIENT = "cairn_transient"
OBJECT_STORE_TRANSIENT_MAX_BYTES = 1 << 30

INGEST_ROUTER_DURABLE = "ingest-router"
REAUTH_NOTIFIER_DURABLE = "reauth-notifier"
JOB_ACK_WAIT_S = 5 * MINUTE_S  # CAIRN_NATS_JOB_ACK_WAIT default
JOB_MAX_DELIVER = 5  # CAIRN_NATS_JOB_MAX_DELIVER default
NEEDS_REAUTH_EVENT_SUBJECT = subjects.NEEDS_REAUTH_EVENT
MAX_DELIVERIES_ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>"
DEFAULT_RELEASE = "v0.7.0"


@dataclass(frozen=True)
class BucketSpec:
    name: str
    ttl_s: float | None
    history: int


def stream_configs(faithful_webhooks: bool = False) -> list[StreamConfig]:
    file, one = StorageType.FILE, 1
    return [
        StreamConfig(name=STREAM_JOBS, subjects=["cairn.jobs.>"], retention=RetentionPolicy.WORK_QUEUE,
                     storage=file, discard=DiscardPolicy.NEW, duplicate_window=5 * MINUTE_S, num_replicas=one),
        StreamConfig(name=STREAM_RESULTS, subjects=["cairn.results.>"], retention=RetentionPolicy.INTEREST,
                     storage=file, discard=DiscardPolicy.OLD, duplicate_window=MINUTE_S, num_replicas=one),
        StreamConfig(name=STREAM_EVENTS, subjects=["cairn.events.>"], retention=RetentionPolicy.LIMITS,
                     storage=file, discard=DiscardPolicy.OLD, max_age=7 * DAY_S, duplicate_window=MINUTE_S,
                     num_replicas=one),
        StreamConfig(name=STREAM_DLQ, subjects=["cairn.dlq.>"], retention=RetentionPolicy.LIMITS,
                     storage=file, discard=DiscardPolicy.OLD, max_age=30 * DAY_S, num_replicas=one),
        StreamConfig(name=STREAM_WEBHOOKS,
                     subjects=["cairn.webhooks.>"] if faithful_webhooks else ["cairn.webhooks.*.event"],
                     retention=RetentionPolicy.WORK_QUEUE, storage=file, discard=DiscardPolicy.OLD,
                     max_age=24 * HOUR_S, duplicate_window=5 * MINUTE_S, num_replicas=one),
    ]


BUCKETS = (
    BucketSpec(KV_PRESENCE, MINUTE_S, 1),
    BucketSpec(KV_MANIFESTS, 15 * MINUTE_S, 5),
    BucketSpec(KV_RATE_LIMITS, 15 * MINUTE_S, 1),
    BucketSpec(KV_BLOB_HANDLES, 7 * DAY_S, 1),
    BucketSpec(KV_CORE, None, 1),
)


def ingest_router_config(filter_subject: str) -> ConsumerConfig:
    return ConsumerConfig(durable_name=INGEST_ROUTER_DURABLE, filter_subject=filter_subject,
                          deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.EXPLICIT,
                          ack_wait=JOB_ACK_WAIT_S, max_deliver=JOB_MAX_DELIVER)


def reauth_notifier_config() -> ConsumerConfig:
    return ConsumerConfig(durable_name=REAUTH_NOTIFIER_DURABLE, filter_subject=NEEDS_REAUTH_EVENT_SUBJECT,
                          deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.EXPLICIT,
                          ack_wait=JOB_ACK_WAIT_S, max_deliver=JOB_MAX_DELIVER)


async def create_or_update_stream(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        await js.stream_info(config.name)  # type: ignore[arg-type]
    except NotFoundError:
        await js.add_stream(config)
        return
    await js.update_stream(config)


async def create_bucket(js: JetStreamContext, spec: BucketSpec) -> None:
    """Create the KV bucket; an existing one (e.g. a previous dev run) is reused as is.

    With direct get allowed, as nats.go (core's client) creates every KV bucket: a key is read on
    ``$JS.API.DIRECT.GET.<stream>.<key subject>``, a subject the worker template can scope to the
    pool's own keys (the stream-wide ``STREAM.MSG.GET`` could not be).
    """
    try:
        await js.key_value(spec.name)
    except (NotFoundError, BadRequestError):
        await js.create_key_value(KeyValueConfig(bucket=spec.name, ttl=spec.ttl_s, history=spec.history,
                                                 storage=StorageType.FILE, direct=True))


async def bootstrap(js: JetStreamContext, release_info: dict[str, Any], *,
                    faithful_webhooks: bool = False) -> None:
    """Everything core creates at start, in the order core does it."""
    for config in stream_configs(faithful_webhooks):
        await create_or_update_stream(js, config)
    for spec in BUCKETS:
        await create_bucket(js, spec)
    try:
        await js.object_store(OBJECT_STORE_TRANSIENT)
    except (NotFoundError, BadRequestError):
        await js.create_object_store(OBJECT_STORE_TRANSIENT, config=ObjectStoreConfig(
            ttl=HOUR_S, max_bytes=OBJECT_STORE_TRANSIENT_MAX_BYTES, storage=StorageType.FILE))
    kv = await js.key_value(KV_CORE)
    await kv.put(KV_CORE_INFO_KEY, json.dumps(release_info).encode())
