"""The pull loops: one per durable consumer of the pool, fetching within the bridge's in-flight limit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError

from bridges.cairn.consumers import JobConsumer
from bridges.cairn.execution import Shutdown
from workers.cairn.disposition import HANDOVER_NAK_DELAY_S
from workers.cairn.nats_conn import NATS_UNAVAILABLE
from workers.outage import Outage

log = logging.getLogger(__name__)

FETCH_WAIT_S = 2.0  # short: nats-py fetches can stall (ecosystem §2.1); a poll holds no slot
FETCH_ERROR_BACKOFF_S = 1.0
STOP_WAIT_S = FETCH_WAIT_S + 1.0  # at stop, a loop may finish the fetch it is in

Take = Callable[[JobConsumer, Msg], None]  # the bridge owns the message and its slot from here (releases it)


class PullLoops:
    """The pool's pull loops; ``start(js)`` once connected, ``stop()`` at shutdown.

    A fetched message is the bridge's until its disposition (C1), so each loop fetches one
    message, and only when a slot of ``CAIRN_MAX_IN_FLIGHT`` is free. A poll holds no slot: most
    consumers are idle, and idle polls holding slots would make the busy consumer's jobs wait
    for their timeouts. A loop waits for a free slot, fetches, then takes one (:meth:`_slot_for`),
    so at most one message per consumer waits beyond the limit and no job runs beyond it.
    A failed fetch is reported to the NATS :class:`Outage` and backed off; a durable that
    cannot be bound is retried, loudly, never given up. What happens to a message is the bridge's.
    """

    def __init__(self, consumers: Sequence[JobConsumer], slots: asyncio.Semaphore, shutdown: Shutdown,
                 nats_outage: Outage, take: Take, *, tick_s: float) -> None:
        self.consumers = list(consumers)
        self._slots, self._shutdown, self._outage, self._take = slots, shutdown, nats_outage, take
        self._tick_s = tick_s  # in_progress for a fetched message waiting for a slot (AckWait/3, as held ones)
        self._resubscribe = False
        self._js: Any = None
        self.tasks: list[asyncio.Task[None]] = []
        self.pulling: set[str] = set()  # durables whose last fetch ended without error: the liveness record

    def start(self, js: Any, on_end: Callable[[asyncio.Task[Any]], None]) -> list[asyncio.Task[None]]:
        """One task per consumer; ``on_end`` is told when one ends (a loop that dies leaves its
        subject unconsumed: the bridge stops loudly and the supervisor restarts it)."""
        self._js = js
        self.tasks = [asyncio.create_task(self._run(c), name=f"pull-{c.kind}") for c in self.consumers]
        for task in self.tasks:
            task.add_done_callback(on_end)
        return self.tasks

    def resubscribe(self) -> None:
        """After a NATS reconnect: every loop binds its durable again before its next fetch.

        Pull subscriptions may not resume by themselves (nats.py#504).
        """
        self._resubscribe = True

    async def stop(self) -> None:
        """A loop finishes its current fetch; one waiting for a free slot is cancelled."""
        if not self.tasks:
            return
        _, waiting = await asyncio.wait(self.tasks, timeout=STOP_WAIT_S)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _run(self, consumer: JobConsumer) -> None:
        sub = await self._js.pull_subscribe_bind(durable=consumer.durable, stream=consumer.stream)
        try:
            while not self._shutdown.stopping:
                if self._resubscribe or sub is None:
                    sub = await self._rebind(consumer, sub)
                    if sub is None:
                        await asyncio.sleep(FETCH_ERROR_BACKOFF_S)
                        continue
                await self._free_slot()  # a full bridge fetches nothing (another instance may have room)
                if self._shutdown.stopping:
                    break
                try:
                    msgs = await sub.fetch(1, timeout=FETCH_WAIT_S)
                except (TimeoutError, NatsTimeoutError):
                    self.pulling.add(consumer.durable)  # nothing to pull now
                    continue
                except Exception as exc:  # noqa: BLE001 - log (once per outage), back off, bind again
                    self.pulling.discard(consumer.durable)
                    self._outage.failed(f"fetch on {consumer.subject}", exc)
                    await asyncio.sleep(FETCH_ERROR_BACKOFF_S)
                    sub = await self._rebind(consumer, sub)
                    continue
                self._outage.ok()  # a fetch answered: whatever failed before works again
                self.pulling.add(consumer.durable)
                for msg in msgs:  # fetch(1) returns one; stay correct if it ever returns more
                    if await self._slot_for(msg):
                        self._take(consumer, msg)
        finally:
            self.pulling.discard(consumer.durable)
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _free_slot(self) -> None:
        """Until a slot is free, without taking it (the fetch that follows may find nothing)."""
        await self._slots.acquire()
        self._slots.release()

    async def _slot_for(self, msg: Msg) -> bool:
        """Take a slot for ``msg`` (the bridge releases it at the disposition); ``in_progress`` every
        tick while every slot is taken. False when the bridge stops first: the message is NAKed."""
        acquire = asyncio.ensure_future(self._slots.acquire())
        stop = asyncio.ensure_future(self._shutdown.event.wait())
        try:
            while True:
                done, _ = await asyncio.wait({acquire, stop}, timeout=self._tick_s,
                                             return_when=asyncio.FIRST_COMPLETED)
                if acquire in done:
                    return True
                if stop in done:
                    break
                with contextlib.suppress(Exception):  # a lost tick is not fatal; the next one follows
                    await msg.in_progress()
        finally:
            stop.cancel()
            if not acquire.done():
                acquire.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            if await acquire:  # it completed as the stop came: give the slot back
                self._slots.release()
        with contextlib.suppress(Exception):  # not sent: JetStream redelivers after AckWait anyway
            await msg.nak(delay=HANDOVER_NAK_DELAY_S)
        return False

    async def _rebind(self, consumer: JobConsumer, sub: Any) -> Any:
        """A fresh pull subscription on the shared durable, or None if it cannot be bound now."""
        self._resubscribe = False
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        try:
            bound = await self._js.pull_subscribe_bind(durable=consumer.durable, stream=consumer.stream)
        except Exception as exc:  # noqa: BLE001 - e.g. the durable was deleted: keep trying, loudly
            if self._outage.down or isinstance(exc, NATS_UNAVAILABLE):
                self._outage.failed(f"bind {consumer.durable}", exc)
            else:
                log.error("cannot bind %s on %s: %s", consumer.durable, consumer.subject, type(exc).__name__)
            return None
        return bound
