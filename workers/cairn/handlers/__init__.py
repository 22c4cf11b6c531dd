"""Cairn job handlers: the domain work behind the provider pool's Celery tasks (no Celery here)."""

from __future__ import annotations

import logging
from typing import Any

from workers.cairn.disposition import Disposition, ack, nak, term
from workers.cairn.handlers import fetch_source, gear_metrics, parse_blob, reconcile, webhooks
from workers.cairn.handlers.context import Delivery, JobContext, build_context, reset_context
from workers.cairn.handlers.discover import discover
from workers.cairn.handlers.exchange import exchange
from workers.cairn.handlers.failure import disposition_for, refused
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

__all__ = ["HANDLERS", "Delivery", "Disposition", "JobContext", "ack", "build_context", "discover", "exchange",
           "nak", "reset_context", "run_admitted", "term"]


def run_admitted(ctx: JobContext, kind: str, job: Any, delivery: Delivery) -> Disposition:
    """Run a job that admission already parsed and judged; every failure maps onto ack/nak/term.

    Admission (``bridges.cairn.admission.admit``) is the one decision point: nothing here judges
    a raw payload. Errors become the contract's ack discipline in one place
    (``failure.disposition_for``), so a handler only says what success looks like.
    """
    handler = HANDLERS.get(kind)
    if handler is None:  # admission admits only the kinds its pool consumes: a newer bridge's kind
        return refused(f"job kind {kind} has no handler in this release")
    try:
        return handler(ctx, job, delivery)
    except Exception as exc:  # noqa: BLE001 - every failure maps onto ack/nak/term
        return disposition_for(ctx, kind, job, delivery, exc)
