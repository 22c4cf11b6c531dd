"""Presence and manifest records (contract §1 Manifest, §2 Presence), written from inside the pool."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from workers.cairn.contract import subjects
from workers.cairn.contract.messages import ManifestRecord, PresenceRecord
from workers.cairn.handlers.webhooks import presence_flag
from workers.cairn.nats_conn import NATS_UNAVAILABLE, NatsThread, NatsUnavailableError
from workers.cairn.pool import PoolContext
from workers.cairn.refusals import PermissionRefused
from workers.cairn.settings import DEFAULT_PRESENCE_INTERVAL_S
from workers.logs import describe
from workers.providers.registry import get_provider

log = logging.getLogger(__name__)

KV_TIMEOUT_S = 5.0
PRESENCE_INTERVAL_S = DEFAULT_PRESENCE_INTERVAL_S  # contract §2: "every ~20s" (CAIRN_PRESENCE_INTERVAL_S)
MANIFEST_INTERVAL_S = 600.0


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def declared_capabilities(provider: Any) -> dict[str, Any] | None:
    """The provider's DataType → flags map, shared by presence and manifest; None when empty
    (both records omit the key then, like the Go worker)."""
    capabilities = {name: dict(flags) for name, flags in provider.declared_capabilities().data_types.items()}
    return capabilities or None


def presence_record(settings: Any, provider: Any, instance_id: str, webhooks: bool = False) -> dict[str, Any]:
    """Contract §2: worker_name, worker_key, instance_id, version, release, provider, package,
    webhooks (``workers.cairn.handlers.webhooks.presence_flag``), capabilities, last_seen."""
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


def _put(ctx: PoolContext, bucket: str, key: str, record: dict[str, Any]) -> None:
    js = ctx.nats.js  # resolve (and maybe connect) outside the coroutine, never on the loop thread

    async def put() -> None:
        kv = await js.key_value(bucket)
        await kv.put(key, json.dumps(record, separators=(",", ":")).encode())

    ctx.nats.run(put(), KV_TIMEOUT_S)


def write_presence(ctx: PoolContext, instance_id: str | None = None) -> dict[str, Any] | None:
    """Write this instance's presence record; None (nothing written) against an incompatible core."""
    if not ctx.core_gate.allows(ctx.nats):
        return None
    instance_id = instance_id or ctx.settings.instance_id
    record = presence_record(ctx.settings, ctx.provider, instance_id, webhooks=presence_flag(ctx))
    _put(ctx, subjects.PRESENCE_BUCKET, subjects.presence_key(ctx.settings.worker_name, instance_id), record)
    return record


def write_manifest(ctx: PoolContext) -> dict[str, Any] | None:
    """Write the pool's manifest; None (nothing written) against an incompatible core."""
    if not ctx.core_gate.allows(ctx.nats):
        return None
    record = manifest_record(ctx.settings, ctx.provider)
    _put(ctx, subjects.MANIFEST_BUCKET, ctx.settings.worker_name, record)
    return record


@dataclass
class PresenceContext(PoolContext):
    """The worker main process's context: a :class:`PoolContext` and nothing more.

    The main process builds its own (no HTTP clients, no Redis, no rate limiter):
    the job context belongs to the pool processes and is rebuilt after every fork.
    Being a ``PoolContext``, it has the identity everything shared with the job
    context reads (``worker_name``, ``provider_name``, ``core_gate``).
    """

    @classmethod
    def from_settings(cls, settings: Any) -> PresenceContext:
        return cls(settings=settings, provider=get_provider(str(settings.provider), settings),
                   nats=NatsThread(settings))

    def close(self) -> None:
        self.nats.close()


class PresenceTimer:
    """Renews one instance's presence record every interval, idle or busy (contract §2, invariant C5),
    and the pool's manifest every ``MANIFEST_INTERVAL_S`` (contract §1).

    Runs as a daemon thread in each provider worker's *main* process, started when the worker
    is ready (``tasks.presence``), not as a task: a task waits for a free pool slot, so a pool
    busy with long jobs (or a beat that is down) would go stale after core's 45 s, and beat
    would have to know every pool. The main process exists exactly as long as the instance
    consumes jobs and is never busy with one; a NATS KV write needs no Redis. A failed write
    is logged once and retried next interval. The manifest is written at start and again once
    ``manifest_interval_s`` has passed since the last write that landed (bucket TTL 15 min).
    Both records carry :func:`declared_capabilities` (core decides Gear/Metrics jobs from the
    manifest, contract §3, §4), go through the models of :mod:`workers.cairn.contract.messages`, and are
    skipped against an incompatible core (:class:`~workers.cairn.compat.CoreGate`).
    """

    def __init__(self, write: Callable[[], object], interval_s: float = PRESENCE_INTERVAL_S, *,
                 manifest: Callable[[], object] | None = None,
                 manifest_interval_s: float = MANIFEST_INTERVAL_S) -> None:
        self._write = write
        self._manifest = manifest
        self.manifest_interval_s = manifest_interval_s
        self._manifest_due = 0.0  # monotonic time of the next manifest write; 0: at once
        self._manifest_failing = False
        self.manifests = 0
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self.writes = 0
        # The last record written and when (epoch s): what this instance tells ``switchyard health``
        # (``tasks.registration``), since a pool's NATS permissions may write presence but not read it.
        self.last_record: dict[str, Any] | None = None
        self.last_written_at: float | None = None
        self.last_manifest_at: float | None = None  # the same, for the manifest

    def start(self) -> None:
        """Write now, then every interval, from a daemon thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="cairn-presence", daemon=True)
            self._thread.start()

    def beat(self) -> bool:
        """Write the record once; True when written. Failures are logged (once per outage), never raised."""
        with self._lock:
            try:
                record = self._write()
            except Exception as exc:  # noqa: BLE001 - NATS away: the next interval tries again
                if not self._failing:
                    # NATS away, or a refusal (reported at ERROR by the connection), is expected: its
                    # traceback only at DEBUG. Anything else is a bug of ours and shows its traceback
                    # once (it once hid an AttributeError for good).
                    expected = isinstance(exc, (*NATS_UNAVAILABLE, NatsUnavailableError, PermissionRefused))
                    log.warning("presence write failed (%s); retrying every %.0fs", describe(exc),
                                self.interval_s, exc_info=None if expected else exc)
                    if expected:
                        log.debug("presence write failed: traceback", exc_info=exc)
                self._failing = True
                return False
            if self._failing:
                log.info("presence written again")
                self._failing = False
            written = record is not None
            if isinstance(record, dict):
                self.last_record, self.last_written_at = record, time.time()
            self.writes += int(written)
            return written

    def renew_manifest(self, *, now: bool = False) -> bool:
        """Write the manifest if it is due (or ``now``); True when one was written. Never raises."""
        if self._manifest is None or (not now and time.monotonic() < self._manifest_due):
            return False
        try:
            written = self._manifest() is not None
        except Exception as exc:  # noqa: BLE001 - NATS away: the next interval tries again
            if not self._manifest_failing:  # once per outage, as presence
                log.warning("manifest write failed (%s); retrying every %.0fs", describe(exc), self.interval_s)
            self._manifest_failing = True
            return False
        if written:
            if self._manifest_failing:
                log.info("manifest written again")
            self._manifest_failing = False
            self.manifests += 1
            self.last_manifest_at = time.time()
            self._manifest_due = time.monotonic() + self.manifest_interval_s
        return written

    def stop(self, timeout_s: float = KV_TIMEOUT_S) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        self.beat()
        self.renew_manifest()
        while not self._stop.wait(self.interval_s):
            self.beat()
            self.renew_manifest()
