"""Liveness records: each long-running fleet process says, in Redis, that it runs and what it serves."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field, ValidationError

log = logging.getLogger(__name__)

PREFIX = "sy:health:proc:"  # one key with a TTL per process: sy:health:proc:<role>:<name>
# Roles: every Celery worker (tasks.registration), bridges.voicy, bridges.cairn.bridge.
WORKER, VOICY_BRIDGE, CAIRN_BRIDGE = "worker", "voicy_bridge", "cairn_bridge"
OK = "ok"
RENEW_INTERVAL_S = 5.0
RECORD_TTL_S = 3 * RENEW_INTERVAL_S  # two renewals may be missed (a busy moment) before the record goes
REDIS_TIMEOUT_S = 3.0  # a renewal never blocks its process longer than this (Redis away)
SCAN_BATCH = 200


def process_name() -> str:
    """``<host>-<pid>``: unique across hosts and restarts, readable in the verdict."""
    return f"{socket.gethostname()}-{os.getpid()}"


class ProcessRecord(BaseModel):
    """What one process says about itself; fields beyond ``state`` are each role's own.

    ``switchyard health`` (``ops.health``) judges a fleet from these records without asking
    any process anything (an ``inspect`` broadcast waits out its timeout; a busy parent may
    miss it), so a stopped bridge or an unconsumed queue shows before work piles up.
    """

    role: str
    name: str
    host: str = Field(default_factory=socket.gethostname)
    pid: int = Field(default_factory=os.getpid)
    at: float = Field(default_factory=time.time)  # epoch seconds of this renewal
    state: str = OK  # "ok", or why this process cannot do its work now
    queues: list[str] = Field(default_factory=list)  # worker: the Celery queues it consumes
    cairn_instance: str | None = None  # worker: its presence instance id (a provider worker)
    presence_at: float | None = None  # worker: when its presence record was last written (epoch s)
    presence_webhooks: bool | None = None  # worker: the ``webhooks`` flag that record carries
    manifest_at: float | None = None  # worker: when it last wrote its pool's manifest (epoch s)
    pool: str | None = None  # worker, cairn_bridge: the Cairn pool (CAIRN_WORKER_NAME) it serves
    provider: str | None = None  # worker, cairn_bridge: that pool's provider (CAIRN_PROVIDER)
    # cairn_bridge: every durable it serves (the pool's job durables, the webhook durable when webhooks
    # are on), so the verdict judges the pool by what its bridges run, not by the asker's environment
    durables: list[str] = Field(default_factory=list)
    pulling: list[str] = Field(default_factory=list)  # cairn_bridge: durables whose last fetch answered
    nats_connected: bool | None = None  # cairn_bridge: its NATS connection is up

    @property
    def ok(self) -> bool:
        return self.state == OK


def record_key(role: str, name: str) -> str:
    return f"{PREFIX}{role}:{name}"


def _ttl_ms(ttl_s: float) -> int:
    return max(1, int(ttl_s * 1000))


def renew(client: Any, record: ProcessRecord, ttl_s: float = RECORD_TTL_S) -> None:
    """Write ``record`` for ``ttl_s`` (a blocking client); Redis errors are the caller's to handle."""
    client.set(record_key(record.role, record.name), record.model_dump_json(), px=_ttl_ms(ttl_s))


async def arenew(client: Any, record: ProcessRecord, ttl_s: float = RECORD_TTL_S) -> None:
    """:func:`renew` with an asyncio client."""
    await client.set(record_key(record.role, record.name), record.model_dump_json(), px=_ttl_ms(ttl_s))


def forget(client: Any, role: str, name: str) -> None:
    client.delete(record_key(role, name))


async def aforget(client: Any, role: str, name: str) -> None:
    await client.delete(record_key(role, name))


def read(client: Any, role: str) -> list[ProcessRecord]:
    """Every live record of ``role`` (a record that expires between the scan and the read is gone)."""
    keys = sorted(client.scan_iter(match=f"{PREFIX}{role}:*", count=SCAN_BATCH))
    records = []
    for raw in client.mget(keys) if keys else []:
        if raw is None:
            continue
        try:
            records.append(ProcessRecord.model_validate_json(raw))
        except ValidationError:
            log.debug("skipping a malformed liveness record")
    return records


class Renewer:
    """Calls ``write`` now and then every ``interval_s`` from a daemon thread, until :meth:`stop`.

    For a process whose own loop is not ours (a Celery worker's main process).
    A write that fails is logged at DEBUG only: the process's own connection
    handling already reports a Redis outage, and the record's TTL tells the
    verdict the rest.
    """

    def __init__(self, write: Callable[[], object], interval_s: float = RENEW_INTERVAL_S) -> None:
        self._write = write
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="liveness", daemon=True)

    def start(self) -> Renewer:
        self._thread.start()
        return self

    def _once(self) -> None:
        try:
            self._write()
        except Exception as exc:  # noqa: BLE001 - Redis away: the TTL says so; try again next interval
            log.debug("liveness record not renewed (%s: %s)", type(exc).__name__, exc)

    def _loop(self) -> None:
        self._once()
        while not self._stop.wait(self.interval_s):
            self._once()

    def stop(self, timeout_s: float = REDIS_TIMEOUT_S) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
