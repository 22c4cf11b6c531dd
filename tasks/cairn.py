"""Thin Celery tasks for Cairn: read the arguments, call ``workers.cairn.handlers``, return the outcome."""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from celery import shared_task
from celery.signals import worker_process_init
from celery.utils.saferepr import saferepr

from tasks import app
from tasks.routes import provider_queue
from tasks.shapes import ShapeRefused, read_cairn_job
from workers.lease import Leases
from workers.logs import setup_logging
from workers.redisconn import redis_settings

log = logging.getLogger(__name__)

JOB_TASK = "cairn.job"
DISCOVER_TASK = "cairn.discover"
EXCHANGE_TASK = "cairn.exchange"
SENTINEL_LEDGER_REPLICAS = 1  # the replica Sentinel would promote
EXCHANGE_REPLY_TTL_S = 30.0  # the parked token reply waits this long for the bridge
ARGSREPR_MAX_CHARS = 1024  # Celery's own bound on a task's shown arguments
HIDDEN = "…"  # what Flower shows instead of a lease token
CONTEXT_MODULE = "workers.cairn.handlers.context"  # the per-process Cairn context a forked child drops


def load_job_code() -> None:
    """Import everything a Cairn task runs, now: in a provider worker's main process, before the fork.

    Every fleet process imports this module (``tasks`` registers every task), but only a provider
    worker runs a Cairn job, so the job code (``workers.cairn.handlers`` with nats-py, the wire
    models, the providers: 0.15 s of CPU) is imported inside the functions that run it ("Imported
    lazily"), never by a gpu or io worker, a Voicy bridge, beat or Flower. A provider worker calls
    this at start (``tasks.presence``), so its prefork children inherit the modules instead of
    importing them at their first job.
    """
    import workers.cairn.handlers.run  # noqa: F401
    import workers.cairn.sealed  # noqa: F401


class CairnRuntime:
    """The per-process objects every Cairn task uses (NATS loop thread, Redis, the provider's HTTP client).

    Built lazily on first use, after the prefork fork, and dropped in ``worker_process_init``.
    """

    def __init__(self) -> None:
        from workers.cairn.handlers.context import build_context
        from workers.cairn.outcomes import LEASE_NAMESPACE, OutcomeLedger

        self.ctx = build_context()
        self.redis = self.ctx.redis
        self.leases = Leases(self.redis, LEASE_NAMESPACE)
        # With Sentinel the outcome must survive a failover: one replica holds it before we return.
        self.ledger = OutcomeLedger(self.redis, replicas=SENTINEL_LEDGER_REPLICAS if redis_settings().sentinel else 0)
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
    context = sys.modules.get(CONTEXT_MODULE)  # imported only where Cairn jobs run (see "Imported lazily")
    if context is not None:
        context.reset_context()
    setup_logging(own_handler=False)  # Celery installed the handlers; ours would print twice


def cairn_configured() -> bool:
    return bool(os.environ.get("CAIRN_NATS_URL"))


def job_argsrepr(kind: str, payload: dict[str, Any], meta: dict[str, Any]) -> str:
    """How a ``cairn.job`` shows in Flower and task events: everything but the lease token.

    A lease token is not a credential, but it names an ownership grant and has
    no business on a dashboard; job payloads from core carry no secret (S1).
    """
    return saferepr([kind, payload, {**meta, "lease_token": HIDDEN}], ARGSREPR_MAX_CHARS)


class PoolSenders:
    """How one pool's bridge queues its work: every task on ``provider.<worker_name>`` (C6).

    The task senders one pool's bridge is given (``bridges/__main__.py``), as the Voicy bridge is
    given ``tasks.voicy``'s dispatchers. A job also names its pool in ``meta``: a worker of another
    pool that ever received it (two pools' workers on one queue by misconfiguration) hands it back
    instead of running it with its provider. The bridge owns every NATS message; the tasks only do
    the provider work and return what the bridge should do with it.
    """

    def __init__(self, worker_name: str) -> None:
        self.worker_name = worker_name
        self.queue = provider_queue(worker_name)

    def job(self, kind: str, job: dict[str, Any], meta: dict[str, Any], task_id: str) -> None:
        """Queue one ``cairn.job`` (the bridge's only way in for JetStream jobs); ``meta`` names the pool."""
        meta = {**meta, "pool": self.worker_name}
        app.send_task(JOB_TASK, args=[kind, job, meta], task_id=task_id, queue=self.queue,
                      argsrepr=job_argsrepr(kind, job, meta))

    def discover(self, request: dict[str, Any], task_id: str, expires_s: float) -> None:
        app.send_task(DISCOVER_TASK, args=[request], task_id=task_id, expires=expires_s, queue=self.queue)

    def exchange(self, request_key: str, task_id: str, expires_s: float) -> None:
        """Only the parking key of the exchange request crosses Celery (S1)."""
        app.send_task(EXCHANGE_TASK, args=[request_key], task_id=task_id, expires=expires_s, queue=self.queue)


# --------------------------------------------------------------------------- tasks


# track_started off: the bridge learns "running" from the lease, not from a STARTED state, and
# Flower gets the task-started event either way; storing it would cost a backend write and a
# pub/sub message to the bridge on every job.
@shared_task(name=JOB_TASK, track_started=False)
def job(*args: Any, **_hints: Any) -> dict[str, Any]:
    """Run one admitted JetStream job, ``(kind, job, meta)``, under its lease; return the disposition.

    ``job`` is the job admission parsed (its model dump); ``meta`` names the message (stream,
    sequence, stream timestamp), the delivery attempt, the subject, the pool and the lease token the
    bridge granted; job payloads from core hold no secret (S1). The result is
    ``Disposition.model_dump()``, through ``workers.cairn.handlers.run.run_job`` (lease, handler,
    outcome ledger). Arguments of a shape this release cannot read (``tasks.shapes``) are refused
    with a NAK that does not count as a failure, so a worker of the release that sent them runs it.
    """
    from workers.cairn.handlers.failure import refused
    from workers.cairn.handlers.run import run_job, wrong_pool

    try:
        sent = read_cairn_job(JOB_TASK, args)
    except ShapeRefused as exc:
        return refused(str(exc)).model_dump()
    rt = runtime()
    misrouted = wrong_pool(rt.ctx, sent.meta)
    if misrouted is not None:
        return misrouted.model_dump()
    return run_job(rt.ctx, rt.leases, rt.ledger, rt.lease_ttl_s, sent.kind, sent.job, sent.meta).model_dump()


@shared_task(name=DISCOVER_TASK)
def discover(request: dict[str, Any]) -> dict[str, Any]:
    """Contract §8 in the pool, ``(request)`` → the reply dict: errors and rate limits are in the reply,
    never an empty success."""
    from workers.cairn.handlers import discover as handle_discover

    return handle_discover(runtime().ctx, request)


@shared_task(name=EXCHANGE_TASK)
def exchange(request_key: str) -> dict[str, Any]:
    """Contract §9b in the pool, ``(request_key)`` → ``{"reply_key": ...}``: request and reply (client
    secret, code, tokens) stay parked in Redis (``workers.cairn.sealed``); only their keys cross Celery."""
    from workers.cairn.handlers import exchange as handle_exchange
    from workers.cairn.sealed import park, unpark

    rt = runtime()
    request = unpark(rt.redis, request_key, missing_ok=True)
    if not isinstance(request, dict):
        reply: dict[str, Any] = {"error": "transient", "message": "exchange request expired before it ran"}
    else:
        reply = handle_exchange(rt.ctx, request)
    return {"reply_key": park(rt.redis, reply, EXCHANGE_REPLY_TTL_S)}
