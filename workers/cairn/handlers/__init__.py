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

from workers.cairn.disposition import Disposition, ack, nak, term
from workers.cairn.handlers import fetch_source, gear_metrics, parse_blob, reconcile
from workers.cairn.handlers.context import Delivery, JobContext, build_context, reset_context
from workers.cairn.handlers.discover import discover
from workers.cairn.handlers.exchange import exchange
from workers.cairn.handlers.failure import disposition_for, terminate

log = logging.getLogger(__name__)

HANDLERS = {
    "fetch_source": fetch_source.handle,
    "reconcile": reconcile.handle,
    "parse_blob": parse_blob.handle,
    "import_gear": gear_metrics.handle_gear,
    "import_metrics": gear_metrics.handle_metrics,
}

__all__ = ["Delivery", "Disposition", "JobContext", "ack", "build_context", "discover", "exchange",
           "handle_job", "nak", "reset_context", "term"]


def handle_job(ctx: JobContext, kind: str, payload: dict[str, Any],
               delivery: Delivery | int | dict[str, Any] | None = None) -> Disposition:
    """Run one job and say what the bridge should do with its message."""
    from workers.cairn.jobs import parse_job

    run = Delivery.coerce(delivery)
    handler = HANDLERS.get(kind)
    if handler is None:
        return terminate(ctx, kind, payload if isinstance(payload, dict) else {}, run,
                         code="unsupported_job", message=f"this pool does not serve {kind}")
    try:
        job = parse_job(kind, payload)
    except (ValidationError, ValueError, TypeError) as exc:
        return terminate(ctx, kind, payload if isinstance(payload, dict) else {}, run,
                         code="bad_payload", message=_describe(exc))
    try:
        return handler(ctx, job, run)
    except Exception as exc:  # noqa: BLE001 - every failure maps onto ack/nak/term
        return disposition_for(ctx, kind, job, run, exc)


def _describe(exc: Exception) -> str:
    """Field locations and error types only: never the input values."""
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['type']}"
                         for e in exc.errors()[:5])
    return type(exc).__name__
