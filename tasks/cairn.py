"""Thin Celery tasks for Cairn: take the lease, call ``workers.cairn.handlers``, return the outcome.

The bridge (``bridges/cairn.py``) owns every NATS message; these tasks only do
the provider work and return what the bridge should do with it:

* ``cairn.job(kind, payload, meta)`` → ``Disposition.model_dump()``. ``meta``
  carries the delivery attempt, the stream sequence, the subject and the lease
  token the bridge granted; job payloads from core hold no secret (S1).
* ``cairn.discover(request)`` → the §8 reply dict.
* ``cairn.exchange(request_key)`` → ``{"reply_key": ...}``: request and reply
  (client secret, code, tokens) stay parked in Redis (``workers.cairn.sealed``).

Presence and the manifest live in :mod:`tasks.presence`.

Per-process state (the NATS connection thread, Redis, the provider's HTTP
client) is built lazily on first use, after the prefork fork, and dropped in
``worker_process_init``.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import shared_task
from celery.signals import worker_process_init

from workers.lease import LeaseKeeper, Leases
from workers.logs import setup_logging

log = logging.getLogger(__name__)

JOB_TASK = "cairn.job"
DISCOVER_TASK = "cairn.discover"
EXCHANGE_TASK = "cairn.exchange"
LEASE_NAMESPACE = "cairn"
EXCHANGE_REPLY_TTL_S = 30.0  # the parked token reply waits this long for the bridge
ARGSREPR_MAX_CHARS = 1024  # Celery's own bound on a task's shown arguments
HIDDEN = "…"  # what Flower shows instead of a lease token


class CairnRuntime:
    """The per-process objects every Cairn task uses."""

    def __init__(self) -> None:
        from workers.cairn.handlers.context import build_context

        self.ctx = build_context()
        self.redis = self.ctx.redis
        self.leases = Leases(self.redis, LEASE_NAMESPACE)
        self.lease_ttl_s = float(self.ctx.settings.lease_ttl_s)


_runtime: CairnRuntime | None = None
_runtime_lock = threading.Lock()


def runtime() -> CairnRuntime:
    """The process's Cairn runtime, built on first use (after fork, never in the parent)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = CairnRuntime()
        return _runtime


@worker_process_init.connect
def _reset_after_fork(**_: object) -> None:
    """A forked child must not reuse the parent's NATS loop thread or sockets."""
    global _runtime
    _runtime = None
    if cairn_configured():
        from workers.cairn.handlers.context import reset_context

        reset_context()
    setup_logging(own_handler=False)  # Celery installed the handlers; ours would print twice


def cairn_configured() -> bool:
    return bool(os.environ.get("CAIRN_NATS_URL"))


def job_argsrepr(kind: str, payload: dict[str, Any], meta: dict[str, Any]) -> str:
    """How a ``cairn.job`` shows in Flower and task events: everything but the lease token.

    A lease token is not a credential, but it names an ownership grant and has
    no business on a dashboard; job payloads from core carry no secret (S1).
    """
    from celery.utils.saferepr import saferepr

    return saferepr([kind, payload, {**meta, "lease_token": HIDDEN}], ARGSREPR_MAX_CHARS)


def send_job(sender: Any, kind: str, payload: dict[str, Any], meta: dict[str, Any], task_id: str) -> None:
    """Queue one ``cairn.job`` (the bridge's only way in); ``sender`` is the Celery app."""
    sender.send_task(JOB_TASK, args=[kind, payload, meta], task_id=task_id,
                     argsrepr=job_argsrepr(kind, payload, meta))


# --------------------------------------------------------------------------- tasks


# track_started off: the bridge learns "running" from the lease, not from a STARTED state, and
# Flower gets the task-started event either way; storing it would cost a backend write and a
# pub/sub message to the bridge on every job.
@shared_task(name=JOB_TASK, bind=True, track_started=False)
def job(self: Any, kind: str, payload: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """Run one JetStream job under its lease and return the disposition for the bridge."""
    from workers.cairn.disposition import nak
    from workers.cairn.handlers import handle_job

    rt = runtime()
    seq, token = str(meta["seq"]), str(meta["lease_token"])
    running = rt.leases.take(seq, token, rt.lease_ttl_s)
    if running is None:
        # The bridge revoked this copy (start deadline, shutdown) or a newer delivery owns the job.
        log.info("cairn job seq %s: lease not granted to this task; skipping", seq)
        return nak(reason="lease not granted to this task", failure=False).model_dump()
    try:
        with LeaseKeeper(rt.leases, seq, running, rt.lease_ttl_s) as keeper:
            delivery = _delivery(meta, keeper, rt.leases, seq)
            disposition = handle_job(rt.ctx, kind, payload, delivery)
    finally:
        rt.leases.release(seq, running)
    return disposition.model_dump()


def _delivery(meta: dict[str, Any], keeper: LeaseKeeper, leases: Leases, seq: str) -> Any:
    """The delivery facts, with a live ownership probe: the keeper's flag, or a direct lease read.

    Handlers ask it right before publishing, so a copy whose message was handed
    to another instance (e.g. after a bridge's shutdown grace) does not publish too.
    """
    from workers.cairn.handlers.context import Delivery

    def lost() -> bool:
        return keeper.lost.is_set() or leases.holder(seq) != keeper.value

    return Delivery(attempt=int(meta["delivery"]), stream_seq=int(meta["seq"]),
                    subject=str(meta.get("subject", "")), lost=lost)


@shared_task(name=DISCOVER_TASK)
def discover(request: dict[str, Any]) -> dict[str, Any]:
    """Contract §8 in the pool: errors and rate limits are in the reply, never an empty success."""
    from workers.cairn.handlers import discover as handle_discover

    return handle_discover(runtime().ctx, request)


@shared_task(name=EXCHANGE_TASK)
def exchange(request_key: str) -> dict[str, Any]:
    """Contract §9b in the pool; only parking keys cross Celery."""
    from workers.cairn.handlers import exchange as handle_exchange
    from workers.cairn.sealed import park, unpark

    rt = runtime()
    request = unpark(rt.redis, request_key, missing_ok=True)
    if not isinstance(request, dict):
        reply: dict[str, Any] = {"error": "transient", "message": "exchange request expired before it ran"}
    else:
        reply = handle_exchange(rt.ctx, request)
    return {"reply_key": park(rt.redis, reply, EXCHANGE_REPLY_TTL_S)}
