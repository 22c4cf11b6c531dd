"""Cairn job handlers: the domain work behind the ``provider`` Celery tasks (no Celery here).

``handle_job(ctx, kind, payload, delivery) -> Disposition`` is the one entry
point for JetStream jobs; ``discover`` and ``exchange`` answer the two
request/reply subjects. Every error is turned into the contract's ack
discipline in one place (``failure.disposition_for``), so a handler only
says what success looks like.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from workers.cairn import webhooks
from workers.cairn.disposition import Disposition, ack, nak, term
from workers.cairn.handlers import fetch_source, gear_metrics, parse_blob, reconcile
from workers.cairn.handlers.context import Delivery, JobContext, build_context, reset_context
from workers.cairn.handlers.discover import discover
from workers.cairn.handlers.exchange import exchange
from workers.cairn.handlers.failure import disposition_for, terminate
from workers.cairn.jobs import PARSER_REFUSED_NAK_DELAY_S, parse_job, parser_refusal
from workers.providers.kinds import FETCH_SOURCE, IMPORT_GEAR, IMPORT_METRICS, PARSE_BLOB, RECONCILE, WEBHOOK_EVENT

log = logging.getLogger(__name__)

HANDLERS = {
    FETCH_SOURCE: fetch_source.handle,
    RECONCILE: reconcile.handle,
    PARSE_BLOB: parse_blob.handle,
    IMPORT_GEAR: gear_metrics.handle_gear,
    IMPORT_METRICS: gear_metrics.handle_metrics,
    WEBHOOK_EVENT: webhooks.handle_event,  # CAIRN_WEBHOOKS events (bridges.cairn.webhooks)
}

__all__ = ["Delivery", "Disposition", "JobContext", "ack", "build_context", "discover", "exchange",
           "handle_job", "nak", "reset_context", "run_admitted", "term"]


def handle_job(ctx: JobContext, kind: str, payload: dict[str, Any],
               delivery: Delivery | int | dict[str, Any] | None = None) -> Disposition:
    """Judge a raw payload and run it: the whole path for a caller that holds no admitted job.

    The bridge does not come this way: its admission (``bridges.cairn.admission``)
    parses and judges every message once, and the task runs the admitted job with
    :func:`run_admitted` (through ``run.run_job``). This entry keeps the same rules
    for direct callers (tests, tools): a poison payload or an unsupported kind is an
    envelope + term, a ``parse_blob`` our parser must not read is a NAK that is not a failure.
    """
    run = Delivery.coerce(delivery)
    if kind not in HANDLERS:
        return terminate(ctx, kind, payload if isinstance(payload, dict) else {}, run,
                         code="unsupported_job", message=f"this pool does not serve {kind}")
    try:
        job = parse_job(kind, payload)
    except (ValidationError, ValueError, TypeError) as exc:
        return terminate(ctx, kind, payload if isinstance(payload, dict) else {}, run,
                         code="bad_payload", message=_describe(exc))
    refusal = parser_refusal(job, ctx.provider.parser_version)
    if refusal:
        return nak(PARSER_REFUSED_NAK_DELAY_S, reason=f"parser refuses: {refusal}", failure=False)
    return run_admitted(ctx, kind, job, run)


def run_admitted(ctx: JobContext, kind: str, job: Any, delivery: Delivery) -> Disposition:
    """Run a job that admission already parsed and judged; every failure maps onto ack/nak/term."""
    handler = HANDLERS.get(kind)
    if handler is None:  # admission only admits the kinds this pool consumes; a newer bridge's kind
        return terminate(ctx, kind, job, delivery, code="unsupported_job",
                         message=f"this pool does not serve {kind}")
    try:
        return handler(ctx, job, delivery)
    except Exception as exc:  # noqa: BLE001 - every failure maps onto ack/nak/term
        return disposition_for(ctx, kind, job, delivery, exc)


def _describe(exc: Exception) -> str:
    """Field locations and error types only: never the input values."""
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['type']}"
                         for e in exc.errors()[:5])
    return type(exc).__name__
