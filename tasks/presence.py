"""Cairn presence and manifest plumbing (contract §1 Manifest, §2 Presence; invariant C5).

* **Presence**: every provider worker's *main* process renews its instance's
  record on the contract's cadence (``CAIRN_PRESENCE_INTERVAL_S``, ~20 s) from a
  :class:`~workers.cairn.presence.PresenceTimer` started at ``worker_ready``
  and stopped at ``worker_shutdown``. Idle or busy, with or without beat, and
  through a Redis outage: see the timer's docstring for why this replaced
  beat's ``Broadcast`` task (whose messages piled up in ``bcast.*`` lists in
  Redis and never reached the pool). ``celery -A tasks control cairn_presence``
  (:func:`broadcast_presence`) makes every live instance write its record now.
* **Manifest**: one ``cairn.manifest`` task at each worker's start, then from
  beat every ``MANIFEST_INTERVAL_S`` (the bucket's TTL is 15 min). Any instance
  may write it; it runs in a pool process like a job, on the job context.

Only workers that consume the ``provider`` queue (or every queue) do any of
this, and only when Cairn is configured (``CAIRN_NATS_URL``).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any

from celery import shared_task
from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown
from celery.worker.control import control_command

from tasks import app
from tasks.cairn import cairn_configured, runtime
from tasks.routes import QUEUE_PROVIDER
from workers.cairn.presence import MANIFEST_INTERVAL_S, PresenceContext, PresenceTimer, write_manifest, write_presence
from workers.cairn.refusals import POOL_ROLE, fault_component
from workers.cairn.settings import CairnSettings, load_cairn_settings
from workers.errors import ConfigError
from workers.faults import clear_fault
from workers.redisconn import sync_client

log = logging.getLogger(__name__)

MANIFEST_TASK = "cairn.manifest"
PRESENCE_CONTROL = "cairn_presence"  # the remote-control command: write presence now
EXIT_CONFIG_ERROR = 2
_INSTANCE_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_=-]+")  # KV keys: no '@', and '.' separates the key

_settings: CairnSettings | None = None  # validated at start, in the worker's main process
_timer: PresenceTimer | None = None
_context: PresenceContext | None = None


def instance_id(hostname: str | None) -> str:
    """``CAIRN_WORKER_INSTANCE_ID``, else the Celery node name made KV-safe (``provider@host`` → ``provider-host``)."""
    explicit = (os.environ.get("CAIRN_WORKER_INSTANCE_ID") or os.environ.get("CAIRN_INSTANCE_ID") or "").strip()
    base = explicit or hostname or os.uname().nodename
    return _INSTANCE_ID_UNSAFE.sub("-", base).strip("-") or "instance"


def consumes_provider(consumer_app: Any) -> bool:
    """Whether this worker consumes ``provider`` (``-Q provider``, or no ``-Q``: every queue)."""
    consume_from = consumer_app.amqp.queues.consume_from
    return not consume_from or QUEUE_PROVIDER in consume_from


def broadcast_presence() -> None:
    """Ask every live provider-worker instance to write its presence record now (no reply awaited)."""
    app.control.broadcast(PRESENCE_CONTROL)


@celeryd_after_setup.connect
def _check_cairn_settings_at_start(instance: Any, **_: object) -> None:
    """A provider worker stops at start on a bad ``CAIRN_*`` (say ``CAIRN_PRESENCE_INTERVAL_S=60``),
    naming it, instead of running a pool that can never report itself present."""
    global _settings
    if not (cairn_configured() and consumes_provider(instance.app)):
        return
    try:
        _settings = load_cairn_settings()
    except ConfigError as exc:
        print(f"switchyard celery worker: {exc}", file=sys.stderr)  # as tasks/__init__ words it
        raise SystemExit(EXIT_CONFIG_ERROR) from None


@worker_ready.connect
def _start_presence(sender: Any = None, **_: object) -> None:
    """Contract §1/§2 at start: the manifest (through the pool) and this instance's presence timer."""
    global _timer, _context
    if _settings is None or _timer is not None:
        return
    manifest.apply_async(expires=MANIFEST_INTERVAL_S)
    _clear_refusal_fault(_settings)
    ctx = PresenceContext.from_settings(_settings)
    iid = instance_id(getattr(sender, "hostname", None))
    _context, _timer = ctx, PresenceTimer(lambda: write_presence(ctx, iid), float(_settings.presence_interval_s))
    _timer.start()
    log.info("cairn presence: instance %s renews its record every %.0fs", iid, _timer.interval_s)


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
    global _timer, _context
    if _timer is not None:
        _timer.stop()
    if _context is not None:
        _context.close()
    _timer, _context = None, None


@control_command(name=PRESENCE_CONTROL)
def _presence_now(state: Any, **_: object) -> dict[str, Any]:
    """Remote control: write this instance's presence record now (in the worker's main process)."""
    if _timer is None:
        return {"ok": "no presence timer in this worker"}
    return {"ok": "written" if _timer.beat() else "not written"}


@shared_task(name=MANIFEST_TASK, ignore_result=True)
def manifest() -> None:
    """Write the pool's manifest (contract §1, within its 15 min TTL); skipped against an incompatible core."""
    write_manifest(runtime().ctx)
