"""The pool's durable JetStream consumers: which subjects it pulls, and their configuration."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from workers.cairn.contract import subjects
from workers.cairn.refusals import Refusals
from workers.cairn.settings import CairnSettings
from workers.providers.base import Provider

log = logging.getLogger(__name__)

STREAM_JOBS = subjects.JOBS_STREAM
REQUIRED_KINDS = (subjects.FETCH_SOURCE, subjects.RECONCILE)  # MUST for every pool (§3)
CONSUMER_CREATE_API = "$JS.API.CONSUMER.CREATE"


@dataclass(frozen=True)
class JobConsumer:
    """One subject the pool consumes, the durable every instance shares for it, and its stream.

    Contract §3: one durable pull consumer per job subject, filtered on the exact subject, with a
    shared name (``CAIRN_JOBS`` is a work queue and refuses a second consumer on one filter).
    Webhook events are one more, on ``CAIRN_WEBHOOKS``.
    """

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


def create_subject(consumer: JobConsumer) -> str:
    """``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``: the only consumer creation core's
    permission template grants a worker (contract §1, §3: filtered, on the pool's own subjects)."""
    return f"{CONSUMER_CREATE_API}.{consumer.stream}.{consumer.durable}.{consumer.subject}"


def consumer_config(consumer: JobConsumer, ack_wait_s: float, max_deliver: int) -> ConsumerConfig:
    """``name`` (= the durable) and the filter make nats-py send the filtered
    ``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`` (:func:`create_subject`); with
    ``durable_name`` alone it sends the legacy ``CONSUMER.DURABLE.CREATE``, which the template
    refuses, so under production permissions the pool would not start.

    MaxDeliver is always sent, ``-1`` (unlimited, the default, as the Strava worker's) included,
    so a restart moves an existing durable back to it. Unlimited because rate-limit waits do not
    count towards our term: a finite value would let JetStream drop such a job silently (a
    max-delivered message gets no envelope and sits in the work queue forever). An operator's
    finite value is above ``CAIRN_TERM_AFTER_DELIVERIES`` and its last delivery is termed by us."""
    return ConsumerConfig(name=consumer.durable, durable_name=consumer.durable, filter_subject=consumer.subject,
                          ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
                          ack_wait=ack_wait_s, max_deliver=max_deliver)


async def ensure_consumers(js: JetStreamContext, consumers: Iterable[JobConsumer], ack_wait_s: float,
                           max_deliver: int, refusals: Refusals | None = None) -> None:
    """Create or update every durable (idempotent; several instances may race here).

    Create-or-update on every start applies a changed ``AckWait``/``MaxDeliver``
    (``pull_subscribe`` alone keeps an existing durable's config, ecosystem §2.1), always in the
    filtered form ``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``, the only one core's
    permission template grants (contract §1).

    A creation NATS refuses raises :class:`~workers.cairn.refusals.PermissionRefused` at once
    (``refusals``: the connection's), for the caller to report: the bridge stops with one line.
    """
    for consumer in consumers:
        create = js.add_consumer(consumer.stream, consumer_config(consumer, ack_wait_s, max_deliver))
        if refusals is None:
            await create
        else:
            await refusals.guard(create, create_subject(consumer), claim=True)
        log.info("consumer %s on %s ready (AckWait %.1fs, MaxDeliver %s)", consumer.durable,
                 consumer.subject, ack_wait_s, max_deliver if max_deliver > 0 else "unlimited")
