"""reconcile: catch new activity since the watermark (contract §7; reference §3.13).

* Window: ``max(watermark − 1 h, now − 30 d)`` — never the full history.
* Unknown ext-ids (not in ``known_ext_ids``) become fetch_source sub-jobs on
  *our own* pool subject, capped by ``max_enqueue``, each with the
  deterministic msg-id ``reconcile:<provider>:<account_id>:<ext_id>`` so a
  re-run within the dedup window never enqueues an activity twice.
* The result is published inline to ``cairn.results.reconcile.<p>.<account>``
  **always**, even with nothing new: it is what advances ``last_sync_at``.
  ``new_watermark`` = max(watermark, newest enqueued start).

Coalescing (§7 SHOULD, ~10 min): a Redis ``SET NX`` with a TTL per account
claims the account for ``RECONCILE_COALESCE_S``. A second reconcile job for
the same account inside that time is a cheap ack **that still publishes its
result** (echoing the job's own watermark, no provider call): otherwise a
scheduler backlog would keep ``last_sync_at`` stale and the scheduler would
re-poll the account every tick. The claim holds the job id, so a NAK'd
redelivery of the *same* job is not coalesced, and a failed run releases the
claim so its retry really lists.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from workers.cairn.credentials import fetch_tokens, rfc3339
from workers.cairn.disposition import Disposition, ack
from workers.cairn.handlers.fetch_source import provider_context
from workers.cairn.handlers.publish import BlobTransferError, publish_inline
from workers.cairn.subjects import reconcile_subjob_msg_id, result_msg_id

if TYPE_CHECKING:
    from workers.cairn.handlers.context import Delivery, JobContext

log = logging.getLogger(__name__)

KIND = "reconcile"
RECONCILE_COALESCE_S = 600  # contract §7: coalesce reconcile jobs per account (~10 min)
WATERMARK_OVERLAP_S = 3600  # list from watermark − 1 h (late uploads, clock skew)
MAX_LOOKBACK_S = 30 * 24 * 3600  # never further back than 30 days
DEFAULT_MAX_ENQUEUE = 500
COALESCE_KEY_PREFIX = "cairn:reconcile:coalesce:"
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


def coalesce_key(provider: str, account_id: str) -> str:
    return f"{COALESCE_KEY_PREFIX}{provider}:{account_id}"


def _claim(ctx: JobContext, job: Any) -> bool:
    """True when this job may run the reconcile (first in the window, or its own retry)."""
    if ctx.redis is None:
        return True
    key, owner = coalesce_key(ctx.provider_name, job.account_id), str(job.job_id or "") or "anonymous"
    if ctx.redis.set(key, owner, nx=True, ex=RECONCILE_COALESCE_S):
        return True
    current = ctx.redis.get(key)
    current = current.decode() if isinstance(current, bytes) else current
    return current == owner


def _release(ctx: JobContext, job: Any) -> None:
    if ctx.redis is None:
        return
    try:
        ctx.redis.eval(_RELEASE_IF_OURS, 1, coalesce_key(ctx.provider_name, job.account_id),
                       str(job.job_id or "") or "anonymous")
    except Exception as exc:  # noqa: BLE001 - the TTL ends the claim anyway
        log.warning("reconcile coalesce release failed: %s", type(exc).__name__)


def _watermark(job: Any) -> datetime | None:
    value = getattr(job, "watermark", None)
    if isinstance(value, str):
        value = parse_rfc3339(value)
    return value if isinstance(value, datetime) and value.year > 1 else None


def parse_rfc3339(text: str) -> datetime | None:
    """Go writes up to 9 fractional digits and ``Z``; Python reads 6 and needs an offset."""
    text = text.strip()
    if not text:
        return None
    text = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00").replace("z", "+00:00")
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def reconcile_result(ctx: JobContext, new_watermark: datetime | None) -> dict[str, Any]:
    result: dict[str, Any] = dict(ctx.stamp())
    if new_watermark is not None:
        result["newWatermark"] = rfc3339(new_watermark)
    return result


def handle(ctx: JobContext, job: Any, delivery: Delivery) -> Disposition:
    from workers.cairn.handlers.context import reconcile_result_subject

    watermark = _watermark(job)
    subject = reconcile_result_subject(ctx.provider_name, job.account_id)
    msg_id = result_msg_id(str(job.job_id))
    if not _claim(ctx, job):
        publish_inline(ctx, subject, reconcile_result(ctx, watermark), msg_id)
        log.info("reconcile for account %s coalesced (another ran within %ss)", job.account_id,
                 RECONCILE_COALESCE_S)
        return ack("coalesced")
    try:
        enqueued, newest = _run(ctx, job, watermark)
        new_watermark = max([w for w in (watermark, newest) if w is not None], default=None)
        publish_inline(ctx, subject, reconcile_result(ctx, new_watermark), msg_id)
    except BaseException:
        _release(ctx, job)
        raise
    log.info("reconcile for account %s: %d sub-jobs enqueued", job.account_id, enqueued)
    return ack(f"enqueued {enqueued}")


def _run(ctx: JobContext, job: Any, watermark: datetime | None) -> tuple[int, datetime | None]:
    from workers.cairn.handlers.context import job_subject

    tokens = fetch_tokens(ctx, job.account_id)
    pctx = provider_context(ctx, job, tokens.access_token, tokens.app_id)
    cap = int(getattr(job, "max_enqueue", 0) or DEFAULT_MAX_ENQUEUE)
    known = {str(x) for x in (getattr(job, "known_ext_ids", None) or [])}
    refs = ctx.provider.list_activities(pctx, window_start(watermark), limit=cap, exclude=known)
    subject = job_subject("fetch_source", ctx.provider_name, ctx.worker_name)
    newest: datetime | None = None
    count = 0
    for ref in refs[:cap]:
        body = {"job_id": f"{job.job_id}:{ref.ext_id}", "account_id": job.account_id, "user_id": job.user_id,
                "provider": ctx.provider_name, "ext_id": ref.ext_id, "fetch_streams": True,
                "reason": "reconcile"}
        try:
            ctx.publish(subject, json.dumps(body, separators=(",", ":")).encode(),
                        sub_job_msg_id(ctx.provider_name, job.account_id, ref.ext_id))
        except Exception as exc:  # noqa: BLE001 - NAK the whole job; msg-ids make the re-run idempotent
            raise BlobTransferError(f"enqueue fetch_source: {type(exc).__name__}") from None
        count += 1
        start = ref.start_time.astimezone(UTC)
        newest = start if newest is None or start > newest else newest
    return count, newest
