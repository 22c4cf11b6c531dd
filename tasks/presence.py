"""Cairn presence and manifest plumbing (contract §1 Manifest, §2 Presence; invariant C5)."""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import TYPE_CHECKING, Any

from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown
from celery.worker.control import control_command

from tasks import app
from tasks.cairn import cairn_configured, load_job_code
from tasks.hardening.startup_stop import stopping
from tasks.routes import LEGACY_PROVIDER_QUEUE, PROVIDER_QUEUE_PREFIX, pool_of_queue, provider_queue
from workers.cairn.refusals import POOL_ROLE, fault_component
from workers.cairn.settings import CairnSettings, load_cairn_settings
from workers.errors import ConfigError
from workers.faults import clear_fault
from workers.redisconn import sync_client

if TYPE_CHECKING:  # imported where a provider worker starts its timer: see tasks/cairn.py, "Imported lazily"
    from workers.cairn.presence import PresenceContext, PresenceTimer

log = logging.getLogger(__name__)

PRESENCE_CONTROL = "cairn_presence"  # the remote-control command: write presence and the manifest now
EXIT_CONFIG_ERROR = 2
_INSTANCE_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_=-]+")  # KV keys: no '@', and '.' separates the key

_settings: CairnSettings | None = None  # validated at start, in the worker's main process
_timer: PresenceTimer | None = None
_context: PresenceContext | None = None
_instance: str | None = None  # this worker's presence instance id, once its timer runs


def instance_id(hostname: str | None) -> str:
    """``CAIRN_WORKER_INSTANCE_ID``, else the Celery node name made KV-safe (``provider@host`` → ``provider-host``)."""
    explicit = (os.environ.get("CAIRN_WORKER_INSTANCE_ID") or os.environ.get("CAIRN_INSTANCE_ID") or "").strip()
    base = explicit or hostname or os.uname().nodename
    return _INSTANCE_ID_UNSAFE.sub("-", base).strip("-") or "instance"


def consumed_queues(consumer_app: Any) -> set[str]:
    """The queues this worker was told to consume (``-Q``); empty: every queue."""
    return set(consumer_app.amqp.queues.consume_from or ())


def check_pool_queues(queues: set[str], worker_name: str | None) -> str | None:
    """Why this worker must not start (one line), or None.

    C6: a provider worker consumes its own pool's queue, ``-Q provider.<CAIRN_WORKER_NAME>``.
    ``-Q provider`` is refused with what to run instead, another pool's queue names the
    mismatch, and a worker without ``-Q`` (every queue) adds its own pool's.

    ``worker_name`` is the pool's (``CAIRN_WORKER_NAME``), None when Cairn is not configured.
    """
    own = provider_queue(worker_name or "<CAIRN_WORKER_NAME>")
    if LEGACY_PROVIDER_QUEUE in queues:
        return (f"-Q {LEGACY_PROVIDER_QUEUE} is gone: each provider pool consumes its own queue, "
                f"provider.<CAIRN_WORKER_NAME>; run this one with -Q {own} (docs/operations.md 2.5)")
    others = sorted(q for q in queues if pool_of_queue(q) is not None and q != own)
    if others and worker_name is not None:
        return (f"-Q {','.join(others)} is not this pool's queue: CAIRN_WORKER_NAME={worker_name} "
                f"consumes {own}")
    return None


def serves_a_pool(queues: set[str]) -> bool:
    """Whether this worker is a provider pool's (its pool's queue, or no ``-Q``: every queue)."""
    return not queues or any(q.startswith(PROVIDER_QUEUE_PREFIX) for q in queues)


def current_instance_id() -> str | None:
    """The instance id this worker renews presence under, None when it writes none (``tasks.registration``)."""
    return _instance


def current_pool() -> tuple[str, str] | None:
    """The Cairn pool (``CAIRN_WORKER_NAME``) this worker serves and its provider, None when it serves none."""
    return (_settings.worker_name, _settings.provider) if _settings is not None else None


def last_presence() -> tuple[float, bool] | None:
    """When this worker last wrote its presence record (epoch s) and the ``webhooks`` flag it wrote,
    None before the first write (``tasks.registration`` reports it to ``switchyard health``)."""
    if _timer is None or _timer.last_written_at is None or _timer.last_record is None:
        return None
    return _timer.last_written_at, bool(_timer.last_record.get("webhooks"))


def last_manifest() -> float | None:
    """When this worker last wrote its pool's manifest (epoch s), None before the first write."""
    return _timer.last_manifest_at if _timer is not None else None


def broadcast_presence() -> None:
    """Ask every live provider-worker instance to write its presence record now (no reply awaited)."""
    app.control.broadcast(PRESENCE_CONTROL)


def _stop(line: str) -> None:
    print(f"switchyard celery worker: {line}", file=sys.stderr)  # as tasks/__init__ words it
    raise SystemExit(EXIT_CONFIG_ERROR) from None


@celeryd_after_setup.connect
def _check_cairn_settings_at_start(instance: Any, **_: object) -> None:
    """A provider worker stops at start, with one line, on a queue that is not its pool's or on a bad
    ``CAIRN_*`` (say ``CAIRN_PRESENCE_INTERVAL_S=60``), instead of running a pool that takes
    another pool's jobs, none at all, or can never report itself present."""
    global _settings
    queues = consumed_queues(instance.app)
    settings: CairnSettings | None = None
    if cairn_configured() and (serves_a_pool(queues) or LEGACY_PROVIDER_QUEUE in queues):
        from workers.providers.registry import get_provider

        try:
            settings = load_cairn_settings()
            get_provider(settings.provider, settings)  # the provider's own variables (CAIRN_STRAVA_*) too
        except ConfigError as exc:
            _stop(str(exc))
    problem = check_pool_queues(queues, settings.worker_name if settings else None)
    if problem:
        _stop(problem)
    if settings is None:
        return
    if not queues:  # every queue: its own pool's too (the routes create pool queues only as they are used)
        instance.app.amqp.queues.select_add(provider_queue(settings.worker_name))
    load_job_code()  # before the pool forks: its children inherit the job code
    _settings = settings


@worker_ready.connect
def _start_presence(sender: Any = None, **_: object) -> None:
    """Contract §1/§2 at start: this instance's presence timer, which renews the pool's manifest too.

    Runs in the main process, idle or busy, with or without beat, through a Redis outage
    (:class:`~workers.cairn.presence.PresenceTimer` says why); stopped at ``worker_shutdown``.
    """
    global _timer, _context, _instance
    if _settings is None or _timer is not None or stopping():  # stopping: told to stop while it started
        return
    from workers.cairn.presence import PresenceContext, PresenceTimer, write_manifest, write_presence

    _clear_refusal_fault(_settings)
    ctx = PresenceContext.from_settings(_settings)
    iid = instance_id(getattr(sender, "hostname", None))
    _instance = iid
    _context, _timer = ctx, PresenceTimer(lambda: write_presence(ctx, iid), float(_settings.presence_interval_s),
                                          manifest=lambda: write_manifest(ctx))
    _timer.start()
    log.info("cairn presence: instance %s renews its record every %.0fs (pool %s, queue %s)", iid,
             _timer.interval_s, _settings.worker_name, provider_queue(_settings.worker_name))


def _clear_refusal_fault(settings: CairnSettings) -> None:
    """A pool (re)starting forgets its recorded NATS refusal (``workers.faults``): a restart is what
    follows a permission fix, and the next refusal, if any, records it again at once."""
    client = sync_client(settings.redis_url)
    try:
        clear_fault(client, fault_component(POOL_ROLE, settings.worker_name))
    finally:
        client.close()


@worker_shutdown.connect
def _stop_presence(**_: object) -> None:
    global _timer, _context, _instance
    if _timer is not None:
        _timer.stop()
    if _context is not None:
        _context.close()
    _timer, _context, _instance = None, None, None


@control_command(name=PRESENCE_CONTROL)
def _presence_now(state: Any, **_: object) -> dict[str, Any]:
    """Remote control: write this instance's presence record and its pool's manifest now (in the
    worker's main process)."""
    if _timer is None:
        return {"ok": "no presence timer in this worker"}
    presence = _timer.beat()
    manifest = _timer.renew_manifest(now=True)
    return {"ok": "written" if presence and manifest else "not written"}
