"""The Cairn bridge's liveness record: its pool, the durables it pulls and its NATS state, kept fresh."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from bridges.cairn.execution import Shutdown
from workers import liveness
from workers.logs import redact
from workers.outage import REDIS_UNAVAILABLE, Outage

log = logging.getLogger(__name__)

Status = Callable[[], tuple[bool, list[str]]]  # (NATS connected, the durables whose last fetch answered)


class BridgeRecord:
    """What ``switchyard health`` reads of one bridge instance: "every durable the pool needs is
    bound", "NATS is up"; renewed until the bridge stops, then removed."""

    def __init__(self, aredis: Any, *, pool: str, provider: str, durables: list[str], shutdown: Shutdown,
                 redis_outage: Outage, status: Status) -> None:
        self._r, self.pool, self.provider, self.durables = aredis, pool, provider, durables
        self._shutdown, self._outage, self._status = shutdown, redis_outage, status
        self.instance = f"{pool}.{liveness.process_name()}"

    async def renew(self) -> None:
        """Every ``RENEW_INTERVAL_S`` until the bridge stops; Redis outages are reported, never fatal."""
        while not self._shutdown.stopping:
            connected, pulling = self._status()
            record = liveness.ProcessRecord(role=liveness.CAIRN_BRIDGE, name=self.instance, pool=self.pool,
                                            provider=self.provider, durables=self.durables, pulling=pulling,
                                            nats_connected=connected)
            try:
                await asyncio.wait_for(liveness.arenew(self._r, record), liveness.REDIS_TIMEOUT_S)
                self._outage.ok()
            except REDIS_UNAVAILABLE as exc:  # asyncio's TimeoutError included
                self._outage.failed("liveness record", exc)
            except Exception as exc:  # noqa: BLE001 - not an outage: say so, keep renewing
                log.warning("liveness record not written: %s", redact(f"{type(exc).__name__}: {exc}"))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._shutdown.event.wait(), liveness.RENEW_INTERVAL_S)

    async def forget(self) -> None:
        """A stopping bridge pulls nothing more: its record goes now, not when its TTL runs out."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(liveness.aforget(self._r, liveness.CAIRN_BRIDGE, self.instance),
                                   liveness.REDIS_TIMEOUT_S)
