"""Thin Celery tasks for Cairn: take the lease, call ``workers.cairn.handlers``, return the outcome.

The bridge (``bridges/cairn/``) owns every NATS message; these tasks only do
the provider work and return what the bridge should do with it:

* ``cairn.job(kind, job, meta)`` → ``Disposition.model_dump()``, through
  ``workers.cairn.handlers.run.run_job`` (lease, handler, outcome ledger).
  ``job`` is the job admission parsed (its model dump); ``meta`` names the
  message (stream, sequence, stream timestamp), the delivery attempt, the subject
  and the lease token the bridge granted; job payloads from core hold no secret (S1).
* ``dispatch_job`` / ``dispatch_discover`` / ``dispatch_exchange``: the task
  senders the bridge is given (``bridges/__main__.py``), as the Voicy bridge is
  given ``tasks.voicy``'s dispatchers.
* ``cairn.discover(request)`` → the §8 reply dict.
* ``cairn.exchange(request_key)`` → ``{"reply_key": ...}``: request and reply
  (client secret, code, tokens) stay parked in Redis (``workers.cairn.sealed``).
* ``cairn.presence()`` arrives through a kombu ``Broadcast`` queue that every
  worker consuming ``provider`` also consumes, so *each live instance* writes its
  own ``<worker_name>.<instance_id>`` record from inside the pool.
* ``cairn.manifest()`` at worker start and from beat.

Per-process state (the NATS connection thread, Redis, the provider's HTTP
client) is built lazily on first use, after the prefork fork, and dropped in
``worker_process_init``.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

from celery import shared_task
from celery.utils.saferepr import saferepr
from celery.signals import (beat_init, celeryd_after_setup, task_postrun, task_prerun, worker_process_init,
                            worker_ready)
from kombu import Queue
from kombu.common import Broadcast

from tasks import app
from tasks.routes import QUEUE_PROVIDER
from workers.cairn.handlers import discover as handle_discover
from workers.cairn.handlers import exchange as handle_exchange
from workers.cairn.handlers.context import build_context
from workers.cairn.handlers.run import run_job
from workers.cairn.outcomes import LEASE_NAMESPACE, OutcomeLedger
from workers.cairn.presence import MANIFEST_INTERVAL_S, PRESENCE_INTERVAL_S, BusyPresence
from workers.cairn.sealed import park, unpark
from workers.lease import Leases
from workers.logs import setup_logging

log = logging.getLogger(__name__)

JOB_TASK = "cairn.job"
DISCOVER_TASK = "cairn.discover"
EXCHANGE_TASK = "cairn.exchange"
PRESENCE_TASK = "cairn.presence"
MANIFEST_TASK = "cairn.manifest"
PRESENCE_BROADCAST = "cairn.presence"  # fanout exchange (and queue alias) of the presence broadcast
EXCHANGE_REPLY_TTL_S = 30.0  # the parked token reply waits this long for the bridge
ARGSREPR_MAX_CHARS = 1024  # Celery's own bound on a task's shown arguments
HIDDEN = "…"  # what Flower shows instead of a lease token
_INSTANCE_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_=-]+")  # KV keys: no '@', and '.' separates the key

# Every process (beat, bridge, workers) knows the broadcast queue, so a route by
# its alias resolves to the fanout exchange; workers only *consume* it when they
# consume ``provider`` (added at ``celeryd_after_setup``).
# Redis fanout delivers on the topic ``<exchange>/<routing key>``: publisher and
# consumers must use the same explicit routing key, and a publisher must have
# declared the exchange as fanout in its process (Celery never declares a
# Broadcast on publish), else kombu treats it as direct and nothing arrives.
PRESENCE_QUEUE = Broadcast(PRESENCE_BROADCAST, routing_key=PRESENCE_BROADCAST)
PRESENCE_OPTIONS = {"queue": PRESENCE_BROADCAST, "exchange": PRESENCE_BROADCAST,
                    "routing_key": PRESENCE_BROADCAST}
app.conf.task_queues = (*tuple(app.conf.task_queues or ()), PRESENCE_QUEUE)


def declare_presence_exchange() -> None:
    """Make this process publish the presence broadcast as fanout (beat, tests, worker start)."""
    with app.connection_for_write() as conn:
        PRESENCE_QUEUE.exchange(conn.default_channel).declare()


def broadcast_presence(expires_s: float = PRESENCE_INTERVAL_S) -> None:
    """Ask every live provider-pool instance to write its presence record now."""
    presence.apply_async(expires=expires_s, declare=[PRESENCE_QUEUE.exchange], **PRESENCE_OPTIONS)


class CairnRuntime:
    """The per-process objects every Cairn task uses."""

    def __init__(self) -> None:
        self.ctx = build_context()
        self.redis = self.ctx.redis
        self.leases = Leases(self.redis, LEASE_NAMESPACE)
        self.ledger = OutcomeLedger(self.redis)
        self.lease_ttl_s = float(self.ctx.settings.lease_ttl_s)


_runtime: CairnRuntime | None = None
_runtime_lock = threading.Lock()
_busy: BusyPresence | None = None  # this pool process's presence during long tasks
_busy_lock = threading.Lock()


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
    global _runtime, _busy
    _runtime = None
    _busy = None
    if cairn_configured():
        from workers.cairn.handlers.context import reset_context

        reset_context()
    setup_logging(own_handler=False)  # Celery installed the handlers; ours would print twice


def cairn_configured() -> bool:
    return bool(os.environ.get("CAIRN_NATS_URL"))


def _consumes_provider(consumer_app: Any) -> bool:
    consume_from = consumer_app.amqp.queues.consume_from
    return not consume_from or QUEUE_PROVIDER in consume_from


def instance_queue(hostname: str) -> Queue:
    """This worker instance's own queue: a fanout sent before its consumer subscribed is lost,
    a list queue is not, so the start-up presence goes here."""
    return Queue(f"{PRESENCE_BROADCAST}.{hostname}", routing_key=f"{PRESENCE_BROADCAST}.{hostname}",
                 auto_delete=True)


@celeryd_after_setup.connect
def _consume_presence_broadcast(sender: str, instance: Any, **_: object) -> None:
    """Workers of the provider pool also consume the presence broadcast (and their own queue)."""
    if cairn_configured() and _consumes_provider(instance.app):
        instance.app.amqp.queues.select_add(PRESENCE_QUEUE)
        instance.app.amqp.queues.select_add(instance_queue(sender))


@worker_ready.connect
def _manifest_at_start(sender: Any = None, **_: object) -> None:
    """Contract §1/§2: manifest and this instance's presence at startup (then beat keeps them fresh)."""
    if cairn_configured() and _consumes_provider(app):
        manifest.apply_async(expires=MANIFEST_INTERVAL_S)
        hostname = getattr(sender, "hostname", None)
        if hostname:
            presence.apply_async(queue=instance_queue(hostname), expires=PRESENCE_INTERVAL_S)


def busy_presence() -> BusyPresence:
    """This process's :class:`BusyPresence`, built on first use (after fork), on the runtime's interval."""
    global _busy
    with _busy_lock:
        if _busy is None:
            from workers.cairn.presence import write_presence

            rt = runtime()
            _busy = BusyPresence(lambda iid: write_presence(rt.ctx, iid), float(rt.ctx.settings.presence_interval_s))
        return _busy


@task_prerun.connect
def _cairn_task_started(task_id: str = "", task: Any = None, **_: object) -> None:
    """A Cairn task starts in this pool process: watch it, so a long one keeps the instance present."""
    if task is not None and str(task.name).startswith("cairn.") and cairn_configured():
        busy_presence().started(task_id, instance_id(task.request.hostname))


@task_postrun.connect
def _cairn_task_finished(task_id: str = "", task: Any = None, **_: object) -> None:
    if _busy is not None and task is not None and str(task.name).startswith("cairn."):
        _busy.finished(task_id)


@beat_init.connect
def _declare_for_beat(**_: object) -> None:
    if cairn_configured():
        declare_presence_exchange()


def instance_id(hostname: str | None) -> str:
    """``CAIRN_WORKER_INSTANCE_ID``, else the Celery node name made KV-safe (``provider@host`` → ``provider-host``)."""
    explicit = (os.environ.get("CAIRN_WORKER_INSTANCE_ID") or os.environ.get("CAIRN_INSTANCE_ID") or "").strip()
    base = explicit or hostname or os.uname().nodename
    return _INSTANCE_ID_UNSAFE.sub("-", base).strip("-") or "instance"


def job_argsrepr(kind: str, payload: dict[str, Any], meta: dict[str, Any]) -> str:
    """How a ``cairn.job`` shows in Flower and task events: everything but the lease token.

    A lease token is not a credential, but it names an ownership grant and has
    no business on a dashboard; job payloads from core carry no secret (S1).
    """
    return saferepr([kind, payload, {**meta, "lease_token": HIDDEN}], ARGSREPR_MAX_CHARS)


def dispatch_job(kind: str, job: dict[str, Any], meta: dict[str, Any], task_id: str) -> None:
    """Queue one ``cairn.job`` (the bridge's only way in for JetStream jobs)."""
    app.send_task(JOB_TASK, args=[kind, job, meta], task_id=task_id, argsrepr=job_argsrepr(kind, job, meta))


def dispatch_discover(request: dict[str, Any], task_id: str, expires_s: float) -> None:
    app.send_task(DISCOVER_TASK, args=[request], task_id=task_id, expires=expires_s)


def dispatch_exchange(request_key: str, task_id: str, expires_s: float) -> None:
    """Only the parking key of the exchange request crosses Celery (S1)."""
    app.send_task(EXCHANGE_TASK, args=[request_key], task_id=task_id, expires=expires_s)


# --------------------------------------------------------------------------- tasks


# track_started off: the bridge learns "running" from the lease, not from a STARTED state, and
# Flower gets the task-started event either way; storing it would cost a backend write and a
# pub/sub message to the bridge on every job.
@shared_task(name=JOB_TASK, track_started=False)
def job(kind: str, payload: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """Run one admitted JetStream job under its lease; return the disposition for the bridge."""
    rt = runtime()
    return run_job(rt.ctx, rt.leases, rt.ledger, rt.lease_ttl_s, kind, payload, meta).model_dump()


@shared_task(name=DISCOVER_TASK)
def discover(request: dict[str, Any]) -> dict[str, Any]:
    """Contract §8 in the pool: errors and rate limits are in the reply, never an empty success."""
    return handle_discover(runtime().ctx, request)


@shared_task(name=EXCHANGE_TASK)
def exchange(request_key: str) -> dict[str, Any]:
    """Contract §9b in the pool; only parking keys cross Celery."""
    rt = runtime()
    request = unpark(rt.redis, request_key, missing_ok=True)
    if not isinstance(request, dict):
        reply: dict[str, Any] = {"error": "transient", "message": "exchange request expired before it ran"}
    else:
        reply = handle_exchange(rt.ctx, request)
    return {"reply_key": park(rt.redis, reply, EXCHANGE_REPLY_TTL_S)}



@shared_task(name=PRESENCE_TASK, bind=True, ignore_result=True)
def presence(self: Any) -> None:
    """Write this instance's presence record (contract §2); skipped against an incompatible core (§1)."""
    from workers.cairn.presence import write_presence

    if write_presence(runtime().ctx, instance_id(self.request.hostname)) is not None:
        busy_presence().wrote()


@shared_task(name=MANIFEST_TASK, ignore_result=True)
def manifest() -> None:
    """Write the pool's manifest (contract §1, within its 15 min TTL); skipped against an incompatible core."""
    from workers.cairn.presence import write_manifest

    write_manifest(runtime().ctx)
