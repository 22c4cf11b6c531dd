"""The pool's footprint on JetStream: core release check and the durable job consumers.

Two start-up duties of contract 0.7 live here because both must happen before
the bridge pulls a single job:

* **Release compatibility** (§1 Versioning): core publishes its release under
  ``info`` in the ``cairn_core`` KV; a worker MUST refuse an incompatible core
  (``workers.cairn.compat``, shared with the presence/manifest writers, which
  stop advertising the pool against such a core).
* **Durable pull consumers** (§3): one per job subject of the pool, filtered on
  the exact subject, with a *shared* durable name so every instance of the pool
  binds the same consumer (CAIRN_JOBS is a work queue and refuses a second
  consumer on one filter). Created with create-or-update on every start, so a
  restart with changed ``AckWait``/``MaxDeliver`` applies them (``pull_subscribe``
  alone silently keeps an existing durable's old config, ecosystem §2.1).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from workers.cairn import subjects
# The release check lives in workers/cairn/compat.py, shared with the presence/manifest writers.
from workers.cairn.compat import (  # noqa: F401 - re-exported for the bridge, doctor and tests
    IncompatibleCoreError,
    check_core_release,
    compatible,
    decode_info,
    is_dev_build,
    parse_release,
)

log = logging.getLogger(__name__)

STREAM_JOBS = subjects.JOBS_STREAM
KV_CORE = subjects.CORE_BUCKET
KV_CORE_INFO_KEY = subjects.CORE_INFO_KEY


@dataclass(frozen=True)
class JobConsumer:
    """One job subject of the pool and the durable every instance shares for it."""

    kind: str
    subject: str
    durable: str


def job_consumers(worker_name: str, kinds_and_subjects: Iterable[tuple[str, str]]) -> list[JobConsumer]:
    return [JobConsumer(kind, subject, subjects.durable_name(worker_name, kind))
            for kind, subject in kinds_and_subjects]


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
        await js.add_consumer(STREAM_JOBS, consumer_config(consumer, ack_wait_s, max_deliver))
        log.info("consumer %s on %s ready (AckWait %.1fs, MaxDeliver %s)", consumer.durable,
                 consumer.subject, ack_wait_s, max_deliver if max_deliver > 0 else "unlimited")
