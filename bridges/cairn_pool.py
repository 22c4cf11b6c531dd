"""The pool's footprint on JetStream: core release check and the durable job consumers.

Two start-up duties of contract 0.7 live here because both must happen before
the bridge pulls a single job:

* **Release compatibility** (§1 Versioning): core publishes its release under
  ``info`` in the ``cairn_core`` KV; a worker MUST refuse an incompatible core.
  Before 1.0 that means the same major.minor; from 1.0 the same major and our
  minor not above core's. *Dev builds are exempt*, on either side, by the one
  rule the settings validate ``CAIRN_RELEASE`` with
  (:func:`workers.cairn.settings.is_dev_build`: ``dev``, ``dev-abc123``,
  ``v0.8.0-dev.3``, ...).
  A missing ``info`` record (older core) is a warning, not a refusal.
* **Durable pull consumers** (§3): one per job subject of the pool, filtered on
  the exact subject, with a *shared* durable name so every instance of the pool
  binds the same consumer (CAIRN_JOBS is a work queue and refuses a second
  consumer on one filter). Created with create-or-update on every start, so a
  restart with changed ``AckWait``/``MaxDeliver`` applies them (``pull_subscribe``
  alone silently keeps an existing durable's old config, ecosystem §2.1).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

from workers.cairn import subjects
from workers.cairn.settings import is_dev_build  # the one dev-build rule, shared with CAIRN_RELEASE
from workers.errors import SwitchyardError

log = logging.getLogger(__name__)

STREAM_JOBS = subjects.JOBS_STREAM
KV_CORE = subjects.CORE_BUCKET
KV_CORE_INFO_KEY = subjects.CORE_INFO_KEY

_RELEASE_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+].*)?$")


class IncompatibleCoreError(SwitchyardError):
    """Core's release is not one this worker may run against (contract §1)."""


def parse_release(release: str, side: str = "core") -> tuple[int, int, int]:
    """(major, minor, patch) of a non-dev release; the error names whose release it is."""
    match = _RELEASE_RE.match(release.strip())
    if not match:
        raise IncompatibleCoreError(f"{side} release {release!r} is neither a vMAJOR.MINOR.PATCH version "
                                    "nor a dev build")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def compatible(worker_release: str, core_release: str) -> bool:
    """Contract §1: pre-1.0 same major.minor; from 1.0 same major, worker minor ≤ core minor."""
    if is_dev_build(worker_release) or is_dev_build(core_release):
        return True
    w_major, w_minor, _ = parse_release(worker_release, "worker")
    c_major, c_minor, _ = parse_release(core_release, "core")
    if w_major != c_major:
        return False
    if w_major == 0:
        return w_minor == c_minor
    return w_minor <= c_minor


def decode_info(raw: bytes) -> str:
    """``info`` is JSON ``{"release": "v0.7.0", ...}`` or a bare release string."""
    text = raw.decode("utf-8", errors="replace").strip()
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, dict):
        return str(value.get("release", "")).strip()
    return str(value).strip()


async def check_core_release(js: JetStreamContext, worker_release: str) -> str | None:
    """Refuse an incompatible core; return core's release, or None when it publishes none."""
    try:
        kv = await js.key_value(KV_CORE)
        entry = await kv.get(KV_CORE_INFO_KEY)
    except (BucketNotFoundError, KeyNotFoundError, NotFoundError):
        log.warning("core publishes no release (no %s/%s); running without a compatibility check",
                    KV_CORE, KV_CORE_INFO_KEY)
        return None
    core_release = decode_info(entry.value or b"")
    if not core_release:
        log.warning("core's %s/%s carries no release; running without a compatibility check",
                    KV_CORE, KV_CORE_INFO_KEY)
        return None
    if not compatible(worker_release, core_release):
        raise IncompatibleCoreError(
            f"core release {core_release} is incompatible with this worker's release "
            f"{worker_release} (contract §1: before 1.0 major.minor must match)")
    log.info("core release %s is compatible with worker release %s", core_release, worker_release)
    return core_release


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
