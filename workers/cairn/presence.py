"""Presence and manifest records (contract §1 Manifest, §2 Presence), written from inside the pool.

Presence is written by each live provider-worker instance every ~20 s under
``<worker_name>.<instance_id>``; the manifest under ``<worker_name>`` at start
and every 10 minutes (the bucket TTL is 15 min). Both prove the pool runs.

Both carry the same ``capabilities`` map, from one source
(:func:`declared_capabilities`): core decides from the *manifest* whether the
pool gets ``import_gear`` / ``import_metrics`` jobs (contract §3, §4: "declares
Gear in its manifest"), and shows the presence copy in its worker list.

Both records go through the pydantic models in :mod:`workers.cairn.messages`
(every contract field, parser version ``N.M``, https-only provider meta), so a
malformed record fails here, loudly, instead of silently hiding the pool from
core's worker list or connect form.

Neither is written against an incompatible core (contract §1: a worker MUST
refuse to run against one): the writers ask the process's
:class:`~workers.cairn.compat.CoreGate` first and skip the write, returning
None, while core's ``info`` names a release this worker may not serve.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from workers.cairn import subjects
from workers.cairn.compat import CoreGate
from workers.cairn.messages import ManifestRecord, PresenceRecord
from workers.cairn.settings import DEFAULT_PRESENCE_INTERVAL_S
from workers.cairn.webhooks import presence_flag

log = logging.getLogger(__name__)

KV_TIMEOUT_S = 5.0
PRESENCE_INTERVAL_S = DEFAULT_PRESENCE_INTERVAL_S  # contract §2: "every ~20s" (CAIRN_PRESENCE_INTERVAL_S)
MANIFEST_INTERVAL_S = 600.0
BUSY_CHECKS_PER_INTERVAL = 4  # how often, per presence interval, a busy process looks at its tasks


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def declared_capabilities(provider: Any) -> dict[str, Any] | None:
    """The provider's DataType → flags map, shared by presence and manifest; None when empty
    (both records omit the key then, like the Go worker)."""
    capabilities = {name: dict(flags) for name, flags in provider.declared_capabilities().data_types.items()}
    return capabilities or None


def presence_record(settings: Any, provider: Any, instance_id: str, webhooks: bool = False) -> dict[str, Any]:
    """Contract §2: worker_name, worker_key, instance_id, version, release, provider, package,
    webhooks (``workers.cairn.webhooks.presence_flag``), capabilities, last_seen."""
    record = {
        "worker_name": settings.worker_name, "worker_key": subjects.worker_key(settings.worker_name,
                                                                             settings.provider),
        "instance_id": instance_id, "version": str(provider.parser_version),
        "release": str(getattr(settings, "release", "")), "provider": settings.provider,
        "package": settings.worker_package, "webhooks": webhooks,
        "capabilities": declared_capabilities(provider), "last_seen": _now(),
    }
    return PresenceRecord.model_validate(record).to_wire()


def manifest_record(settings: Any, provider: Any) -> dict[str, Any]:
    """Contract §1 fields, the pool's ``capabilities`` (what core gates gear/metrics jobs on)
    and ``provider_meta`` when the pool links accounts."""
    record = {"worker_name": settings.worker_name, "version": str(provider.parser_version),
              "provider": settings.provider, "package": settings.worker_package, "updated_at": _now(),
              "capabilities": declared_capabilities(provider)}
    meta = provider.manifest_meta()
    if meta:
        record["provider_meta"] = meta
    return ManifestRecord.model_validate(record).to_wire()


def _put(ctx: Any, bucket: str, key: str, record: dict[str, Any]) -> None:
    js = ctx.nats.js  # resolve (and maybe connect) outside the coroutine, never on the loop thread

    async def put() -> None:
        kv = await js.key_value(bucket)
        await kv.put(key, json.dumps(record, separators=(",", ":")).encode())

    ctx.nats.run(put(), KV_TIMEOUT_S)


_process_gates: dict[str, CoreGate] = {}


def core_gate(ctx: Any) -> CoreGate:
    """The context's gate (``JobContext.core_gate``), else one per process and worker release."""
    gate = getattr(ctx, "core_gate", None)
    if isinstance(gate, CoreGate):
        return gate
    release = str(getattr(ctx.settings, "release", ""))
    return _process_gates.setdefault(release, CoreGate(release))


def write_presence(ctx: Any, instance_id: str | None = None) -> dict[str, Any] | None:
    """Write this instance's presence record; None (nothing written) against an incompatible core."""
    if not core_gate(ctx).allows(ctx.nats):
        return None
    instance_id = instance_id or ctx.settings.instance_id
    record = presence_record(ctx.settings, ctx.provider, instance_id, webhooks=presence_flag(ctx))
    _put(ctx, subjects.PRESENCE_BUCKET, subjects.presence_key(ctx.settings.worker_name, instance_id), record)
    return record


def write_manifest(ctx: Any) -> dict[str, Any] | None:
    """Write the pool's manifest; None (nothing written) against an incompatible core."""
    if not core_gate(ctx).allows(ctx.nats):
        return None
    record = manifest_record(ctx.settings, ctx.provider)
    _put(ctx, subjects.MANIFEST_BUCKET, ctx.settings.worker_name, record)
    return record


class BusyPresence:
    """Keeps an instance present while long tasks hold every slot of its pool.

    Beat's presence broadcast is a task: it waits for a free pool slot. When
    every slot runs a job longer than core's 45 s freshness window (a slow
    provider, ``-c 1``), the record would go stale and core would show the
    pool offline, gate the connect flow on it and reap its manifest, exactly
    while it works hardest. So each pool process also watches its own tasks:
    once one has run for a presence interval and this process has written no
    record for as long, a daemon thread writes the instance's record itself.
    It runs in the pool process, on the connection the jobs use, so it still
    only proves what the beat path proves: this instance runs (as the Go
    worker's own presence ticker does). Short tasks never trigger it; there
    the broadcast gets through between jobs.
    """

    def __init__(self, write: Callable[[str], object], interval_s: float = PRESENCE_INTERVAL_S, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._write = write
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._running: dict[str, tuple[float, str]] = {}  # task id -> (started, instance id)
        self._last_write = clock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def started(self, task_id: str, instance_id: str) -> None:
        with self._lock:
            self._running[task_id] = (self._clock(), instance_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="cairn-busy-presence", daemon=True)
                self._thread.start()

    def finished(self, task_id: str) -> None:
        with self._lock:
            self._running.pop(task_id, None)

    def wrote(self) -> None:
        """This process just wrote the record (the beat path): nothing is due for an interval."""
        with self._lock:
            self._last_write = self._clock()

    def due(self) -> str | None:
        """The instance whose record is due now, or None."""
        now = self._clock()
        with self._lock:
            if now - self._last_write < self.interval_s:
                return None
            long_running = [iid for started, iid in self._running.values() if now - started >= self.interval_s]
        return long_running[0] if long_running else None

    def check(self) -> bool:
        """Write the record if one is due; True when written. Failures are logged, never raised."""
        instance_id = self.due()
        if instance_id is None:
            return False
        try:
            self._write(instance_id)
        except Exception as exc:  # noqa: BLE001 - NATS down: the next check tries again
            log.warning("presence during a long task failed: %s", type(exc).__name__)
            return False
        self.wrote()
        return True

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s / BUSY_CHECKS_PER_INTERVAL):
            self.check()
