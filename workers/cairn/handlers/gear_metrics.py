"""import_gear and import_metrics: account-level data jobs (contract §4, §5)."""

from __future__ import annotations

import logging
from typing import Any

from workers.cairn.claimcheck import strict_result
from workers.cairn.contract.subjects import result_msg_id
from workers.cairn.disposition import Disposition, ack
from workers.cairn.handlers.context import Delivery, JobContext, result_subject
from workers.cairn.handlers.failure import Permanent
from workers.cairn.handlers.fetch_source import provider_context
from workers.providers.kinds import IMPORT_GEAR, IMPORT_METRICS

log = logging.getLogger(__name__)


def _declared(ctx: JobContext, kind: str) -> bool:
    return kind in ctx.provider.declared_capabilities().jobs


def handle_gear(ctx: JobContext, job: Any, delivery: Delivery) -> Disposition:
    """One GEAR event per gear (retired included), small enough to publish inline (§5)."""
    if not _declared(ctx, IMPORT_GEAR):
        raise Permanent("unsupported_job", f"{ctx.provider_name} does not serve import_gear")
    events = ctx.provider.import_gear(provider_context(ctx, job), job)
    ctx.claimcheck.publish_inline(result_subject(IMPORT_GEAR, ctx.provider_name, ctx.worker_name),
                                  strict_result({"events": list(events)}),
                                  result_msg_id(str(job.job_id or f"gear-{job.account_id}")))
    log.info("import_gear for account %s: %d gear", job.account_id, len(events))
    return ack()


def handle_metrics(ctx: JobContext, job: Any, delivery: Delivery) -> Disposition:
    """METRIC events, claim-checked; a kind the provider does not declare is Permanent, never a NAK loop."""
    if not _declared(ctx, IMPORT_METRICS):
        raise Permanent("unsupported_job", f"{ctx.provider_name} declares no metrics")
    events = ctx.provider.import_metrics(provider_context(ctx, job), job)
    job_id = job.job_id or f"metrics-{job.account_id}-{job.since_unix}"
    ctx.claimcheck.publish_claim_checked(result_subject(IMPORT_METRICS, ctx.provider_name, ctx.worker_name),
                                         strict_result({"events": list(events)}), result_msg_id(job_id))
    return ack()
