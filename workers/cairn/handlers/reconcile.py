"""reconcile: catch new activity since the watermark (contract §7; reference §3.13)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

from workers.cairn.contract import wire
from workers.cairn.contract.jobs import ReconcileJob
from workers.cairn.contract.pb.cairn.worker.v1 import worker_pb2 as pb
from workers.cairn.contract.subjects import reconcile_subjob_msg_id, result_msg_id
from workers.cairn.disposition import Disposition, ack
from workers.cairn.handlers.context import Delivery, JobContext, job_subject, reconcile_result_subject
from workers.cairn.handlers.fetch_source import provider_context
from workers.cairn.routing import PublishError
from workers.providers.kinds import FETCH_SOURCE

log = logging.getLogger(__name__)

SUBJOB_REASON = "reconcile"  # the ``reason`` of the fetch_source sub-jobs a reconcile enqueues
# Contract §7 SHOULD: a Redis SET NX per account holds the job id for this long; a second reconcile
# inside it acks cheaply but still publishes its result, or last_sync_at would stay stale.
RECONCILE_COALESCE_S = 600  # contract §7: coalesce reconcile jobs per account (~10 min)
WATERMARK_OVERLAP_S = 3600  # list from watermark − 1 h (late uploads, clock skew)
MAX_LOOKBACK_S = 30 * 24 * 3600  # never further back than 30 days
DEFAULT_MAX_ENQUEUE = 500
COALESCE_KEY_PREFIX = "cairn:reconcile:coalesce:"  # + <pool>:<account_id>: pools sharing a Redis never collide
# A reconcile without user_id (the §10 conformance harness, reference §5) is answered with its own
# watermark: a sub-job needs its owner (core refuses a ref.user_id that is not a UUID).
OWNERLESS_REASON = "no user_id: nothing listed or enqueued"
_RELEASE_IF_OURS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def window_start(watermark: datetime | None, now: datetime | None = None) -> datetime:
    now = now or datetime.now(UTC)
    floor = now - timedelta(seconds=MAX_LOOKBACK_S)
    if watermark is None:
        return floor
    return max(watermark.astimezone(UTC) - timedelta(seconds=WATERMARK_OVERLAP_S), floor)


def sub_job_msg_id(provider: str, account_id: str, ext_id: str) -> str:
    return reconcile_subjob_msg_id(provider, account_id, ext_id)


def coalesce_key(worker_name: str, account_id: str) -> str:
    """The pool's claim on one account's reconcile window (per pool: an account is one pool's, and two
    pools of one provider sharing a Redis must not coalesce each other's reconciles)."""
    return f"{COALESCE_KEY_PREFIX}{worker_name}:{account_id}"


def _claim(ctx: JobContext, job: ReconcileJob) -> bool:
    """True when this job may run the reconcile (first in the window, or its own retry)."""
    if ctx.redis is None:
        return True
    key, owner = coalesce_key(ctx.worker_name, job.account_id), str(job.job_id or "") or "anonymous"
    if ctx.redis.set(key, owner, nx=True, ex=RECONCILE_COALESCE_S):
        return True
    current = ctx.redis.get(key)
    current = current.decode() if isinstance(current, bytes) else current
    return current == owner


def _release(ctx: JobContext, job: ReconcileJob) -> None:
    if ctx.redis is None:
        return
    try:
        ctx.redis.eval(_RELEASE_IF_OURS, 1, coalesce_key(ctx.worker_name, job.account_id),
                       str(job.job_id or "") or "anonymous")
    except Exception as exc:  # noqa: BLE001 - the TTL ends the claim anyway
        log.warning("reconcile coalesce release failed: %s", type(exc).__name__)


def reconcile_result(new_watermark: datetime | None) -> pb.JobResult:
    """The inline, event-free result; the claim-check adds the worker stamp."""
    result = pb.JobResult()
    if new_watermark is not None:
        result.new_watermark.CopyFrom(wire.timestamp(new_watermark))
    return result


def handle(ctx: JobContext, job: ReconcileJob, delivery: Delivery) -> Disposition:
    """List from :func:`window_start`, enqueue unknown ext-ids, and always publish the result.

    Sub-jobs go to our own pool subject, capped by ``max_enqueue``, with the deterministic
    :func:`sub_job_msg_id` so a re-run never enqueues one twice. The result is published even
    with nothing new: it advances ``last_sync_at``. A failed run releases its coalescing claim.
    """
    watermark = job.watermark
    subject = reconcile_result_subject(ctx.provider_name, job.account_id)
    msg_id = result_msg_id(str(job.job_id))
    if not job.user_id:
        ctx.claimcheck.publish_inline(subject, reconcile_result(watermark), msg_id)
        log.warning("reconcile %s for account %s carries no user_id: answered without listing "
                    "(sub-jobs need an owner)", job.job_id, job.account_id)
        return ack(OWNERLESS_REASON)
    if not _claim(ctx, job):
        ctx.claimcheck.publish_inline(subject, reconcile_result(watermark), msg_id)
        log.info("reconcile for account %s coalesced (another ran within %ss)", job.account_id,
                 RECONCILE_COALESCE_S)
        return ack("coalesced")
    try:
        enqueued, newest = _run(ctx, job, watermark)
        new_watermark = max([w for w in (watermark, newest) if w is not None], default=None)
        ctx.claimcheck.publish_inline(subject, reconcile_result(new_watermark), msg_id)
    except BaseException:
        _release(ctx, job)
        raise
    log.info("reconcile for account %s: %d sub-jobs enqueued", job.account_id, enqueued)
    return ack(f"enqueued {enqueued}")


def _run(ctx: JobContext, job: ReconcileJob, watermark: datetime | None) -> tuple[int, datetime | None]:
    pctx = provider_context(ctx, job)
    cap = job.max_enqueue or DEFAULT_MAX_ENQUEUE
    known = set(job.known_ext_ids)
    refs = ctx.provider.list_activities(pctx, window_start(watermark), limit=cap, exclude=known)
    subject = job_subject(FETCH_SOURCE, ctx.provider_name, ctx.worker_name)
    newest: datetime | None = None
    count = 0
    for ref in refs[:cap]:
        body = {"job_id": f"{job.job_id}:{ref.ext_id}", "account_id": job.account_id, "user_id": job.user_id,
                "provider": ctx.provider_name, "ext_id": ref.ext_id, "fetch_streams": True,
                "reason": SUBJOB_REASON}
        try:
            ctx.publish(subject, json.dumps(body, separators=(",", ":")).encode(),
                        sub_job_msg_id(ctx.provider_name, job.account_id, ref.ext_id))
        except Exception as exc:  # noqa: BLE001 - NAK the whole job; msg-ids make the re-run idempotent
            raise PublishError(f"enqueue fetch_source: {type(exc).__name__}") from None
        count += 1
        start = ref.start_time.astimezone(UTC)
        newest = start if newest is None or start > newest else newest
    return count, newest
