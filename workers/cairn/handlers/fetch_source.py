"""fetch_source: import one activity (contract §4, §5; reference §3.6)."""

from __future__ import annotations

import logging
from typing import Any

from workers.cairn.claimcheck import KIND_RAW, UserBlobSink, segment_result_msg_id, strict_result
from workers.cairn.contract.pb.cairn.worker.v1 import worker_pb2 as pb
from workers.cairn.contract.subjects import activity_result_msg_id, result_subject
from workers.cairn.credentials import fetch_creds, fetch_tokens
from workers.cairn.disposition import HANDOVER_NAK_DELAY_S, Disposition, ack, nak
from workers.cairn.handlers.context import Delivery, JobContext
from workers.providers.base import AUTH_CREDENTIALS
from workers.providers.context import Login, ProviderContext
from workers.providers.kinds import FETCH_SOURCE
from workers.providers.models import FetchOutcome

log = logging.getLogger(__name__)


def provider_context(ctx: JobContext, job: Any) -> ProviderContext:
    """The provider's view of one job: its credentials, HTTP client and the shared budget of its app.

    Credentials come fresh from core per job (contract §9) as the provider's
    ``auth_method`` says: an OAuth access token (``cairn.tokens.<p>.get``, refreshed
    when close to expiry) or a credentials connection's login (``cairn.creds.<p>.get``).
    The budget is keyed ``<provider>.<app_id>.<window>``; a token without ``app_id``
    (older core) uses the pool's bucket (contract §3). A login has no app: its budget
    is the connected account's own (``app_id`` = the account id), since a credentials
    provider throttles per account and the id names no one outside core. Which
    short-term window the job spends is the provider's decision from the job's
    ``reason`` (Strava: webhook fetches have a window of their own); only fetch_source
    and import_gear jobs carry a reason, the others spend the default.
    """
    account_id = str(job.account_id)
    if ctx.provider.auth_method() == AUTH_CREDENTIALS:
        creds = fetch_creds(ctx, account_id)
        return build_provider_context(ctx, job, app_id=account_id,
                                      login=Login(creds.client_id, creds.client_secret))
    tokens = fetch_tokens(ctx, account_id)
    return build_provider_context(ctx, job, access_token=tokens.access_token, app_id=tokens.app_id)


def build_provider_context(ctx: JobContext, job: Any, *, access_token: str = "", app_id: str = "",
                           login: Login | None = None) -> ProviderContext:
    """The ``ProviderContext`` of ``job`` for credentials already in hand (``provider_context``)."""
    bucket = ctx.provider.bucket_for(str(getattr(job, "reason", "") or ""))
    pctx = ProviderContext(access_token=access_token, http=ctx.http, bucket=bucket, login=login,
                           account_id=str(getattr(job, "account_id", "") or ""))
    if ctx.limiter is not None:
        pctx.rate_limit = ctx.limiter.hook(app_id or None)
    return pctx


def result_msg_id(job_id: str, ext_id: str, delivery: Delivery) -> str:
    """``result:<job_id>:d<n>``; a webhook job without a job id falls back to its ext id."""
    return activity_result_msg_id(job_id or f"ext-{ext_id}", delivery.attempt)


def activity_result(outcome: FetchOutcome) -> pb.JobResult:
    """The full ``JobResult``: events in dependency order, GEAR before the activity (the
    claim-check adds the worker stamp). Strict: a mapping outside the schema is ``BadResult``."""
    gear = [e for e in outcome.wire_events if "gear" in e]
    rest = [e for e in outcome.wire_events if "gear" not in e]
    return strict_result({"events": gear + rest})


def segment_result(outcome: FetchOutcome) -> pb.JobResult | None:
    """The second ``JobResult``: SEGMENT events, then SEGMENT_EFFORT events; None without any."""
    if not outcome.segment_events:
        return None
    segments = [e for e in outcome.segment_events if "segment" in e]
    efforts = [e for e in outcome.segment_events if "segment" not in e]
    return strict_result({"events": segments + efforts})


def publish_results(ctx: JobContext, subject: str, outcome: FetchOutcome, msg_id: str) -> bool:
    """The activity result, then the segment result (``<msg_id>:seg``); True when the latter existed."""
    ctx.claimcheck.publish_claim_checked(subject, activity_result(outcome), msg_id)
    segments = segment_result(outcome)
    if segments is not None:
        ctx.claimcheck.publish_claim_checked(subject, segments, segment_result_msg_id(msg_id))
    return segments is not None


def handle(ctx: JobContext, job: Any, delivery: Delivery) -> Disposition:
    """Credentials, provider fetch, raw archive, then the results; the order is the contract's.

    The raw archive is uploaded *before* the result so the activity names its ``raw_blob_id``
    and a re-parse reproduces this import (a source without its raw inputs could only be
    re-fetched, spending quota). Then the activity result (GEAR events before the ACTIVITY,
    msg-id ``result:<job_id>:d<delivery>`` so a deferred retry re-publishes past the dedup
    window) and the SEGMENT result after it (reference §3.6 steps 10-11). A segment loop out of
    budget NAKs until the window resets, not as a failure.
    """
    pctx = provider_context(ctx, job)
    pctx.blobs = UserBlobSink(ctx.claimcheck)
    outcome = ctx.provider.fetch_source(pctx, job)
    if outcome.archive is not None:
        archive = ctx.claimcheck.upload(kind=KIND_RAW, body=outcome.archive.body,
                                        content_type=outcome.archive.content_type, user_id=job.user_id)
        outcome.attach_raw_blob(archive.blob_id, size_bytes=outcome.archive.size_bytes,
                                content_type=outcome.archive.content_type)
    if delivery.is_lost:  # another copy owns the message now: publishing too would ingest twice
        return nak(HANDOVER_NAK_DELAY_S, reason="lease lost before publishing", failure=False)
    publish_results(ctx, _result_subject(ctx), outcome,
                    result_msg_id(str(getattr(job, "job_id", "") or ""), outcome.ext_id, delivery))
    log.info("fetch_source %s imported (%d events, %d segment events; skipped: %d gear, %d segments, "
             "%d photos)", outcome.ext_id, len(outcome.wire_events), len(outcome.segment_events),
             outcome.gear_errors, outcome.segment_errors, outcome.photo_errors)
    if outcome.rate_limited is not None:  # the segment loop ran out of budget: re-run after the window
        delay = outcome.rate_limited.delay_s()
        log.info("fetch_source %s: segments rate limited (%s window); nak %.0fs", outcome.ext_id,
                 outcome.rate_limited.window, delay)
        return nak(delay, reason=f"rate_limited_segments: {outcome.rate_limited.window} window",
                   failure=False)  # waiting for the window is not failing
    return ack()


def _result_subject(ctx: JobContext) -> str:
    return result_subject(FETCH_SOURCE, ctx.provider_name, ctx.worker_name)
