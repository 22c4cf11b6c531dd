"""The pool's durable JetStream consumers: which subjects it pulls, and their configuration.

Contract §3: one durable pull consumer per job subject of the pool, filtered
on the exact subject, with a *shared* durable name so every instance of the
pool binds the same consumer (CAIRN_JOBS is a work queue and refuses a second
consumer on one filter). Created with create-or-update on every start, so a
restart with changed ``AckWait``/``MaxDeliver`` applies them (``pull_subscribe``
alone silently keeps an existing durable's old config, ecosystem §2.1).

A consumer names its stream: job subjects live on ``CAIRN_JOBS``; a second
consumer kind (webhook events on ``CAIRN_WEBHOOKS``) is one more
:class:`JobConsumer` with its own stream and the admission parser registered
under its ``kind`` (``bridges.cairn.admission.MessageKind``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from workers.cairn import subjects
from workers.cairn.settings import CairnSettings
from workers.providers.base import Provider

log = logging.getLogger(__name__)

STREAM_JOBS = subjects.JOBS_STREAM
REQUIRED_KINDS = (subjects.FETCH_SOURCE, subjects.RECONCILE)  # MUST for every pool (§3)


@dataclass(frozen=True)
class JobConsumer:
    """One subject the pool consumes, the durable every instance shares for it, and its stream."""

    kind: str
    subject: str
    durable: str
    stream: str = STREAM_JOBS


def job_consumers(worker_name: str, kinds_and_subjects: Iterable[tuple[str, str]],
                  stream: str = STREAM_JOBS) -> list[JobConsumer]:
    return [JobConsumer(kind, subject, subjects.durable_name(worker_name, kind), stream)
            for kind, subject in kinds_and_subjects]


def pool_consumers(settings: CairnSettings, provider: Provider) -> list[JobConsumer]:
    """fetch_source and reconcile always; the others (backfill: MAY) only when the provider declares them."""
    declared = set(provider.declared_capabilities().jobs)
    kinds = [k for k in subjects.JOB_KINDS if k in REQUIRED_KINDS or k in declared]
    name, prov = settings.worker_name, settings.provider
    return job_consumers(name, [(k, subjects.job_subject(k, prov, name)) for k in kinds])


def consumer_config(consumer: JobConsumer, ack_wait_s: float, max_deliver: int) -> ConsumerConfig:
    """MaxDeliver is always sent, ``-1`` (unlimited, the default, as the Strava worker's) included,
    so a restart moves an existing durable back to it. Unlimited because rate-limit waits do not
    count towards our term: a finite value would let JetStream drop such a job silently (a
    max-delivered message gets no envelope and sits in the work queue forever). An operator's
    finite value is above ``CAIRN_TERM_AFTER_DELIVERIES`` and its last delivery is termed by us."""
    return ConsumerConfig(durable_name=consumer.durable, filter_subject=consumer.subject,
                          ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
                          ack_wait=ack_wait_s, max_deliver=max_deliver)


async def ensure_consumers(js: JetStreamContext, consumers: Iterable[JobConsumer], ack_wait_s: float,
                           max_deliver: int) -> None:
    """Create or update every durable (idempotent; several instances may race here)."""
    for consumer in consumers:
        await js.add_consumer(consumer.stream, consumer_config(consumer, ack_wait_s, max_deliver))
        log.info("consumer %s on %s ready (AckWait %.1fs, MaxDeliver %s)", consumer.durable,
                 consumer.subject, ack_wait_s, max_deliver if max_deliver > 0 else "unlimited")
