"""An in-process JetStream stand-in: messages that record ack/nak/term/in_progress, a stream that redelivers.

The fast tier's broker, as dramatiq's ``StubBroker`` is its: the Cairn bridge's decision core
(``bridges.cairn.holder.Holder``: admission → execution → settle) runs against it without a
server. What it keeps of JetStream is what the core reads and does: a message's metadata
(stream, stream sequence, stream timestamp, ``num_delivered``), its dispositions, and the
redelivery of a message that was NAKed (or never settled) until it is acked or termed. Time is
not simulated: a NAK's delay is recorded, and the next delivery is handed out when asked for.
The real servers stay in the integration tests (``test_cairn_ack_e2e.py``, ``test_cairn_e2e.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import redis.exceptions

from bridges.cairn.admission import DeliveryMeta, Envelope, History
from bridges.cairn.consumers import JobConsumer
from workers.cairn.disposition import Disposition
from workers.cairn.outcomes import MessageKey
from workers.lease import LeaseState, LeaseView
from workers.outage import Outage

FINAL = ("ack", "term")  # after one of these JetStream delivers the message no more
STUB_STREAM = "CAIRN_JOBS"


@dataclass
class StubMsg:
    """One delivery of a message: nats-py's ``Msg`` as the bridge uses it, recording what was sent.

    ``connected=False`` is a client that lost NATS (nats-py would only buffer an ack then).
    """

    subject: str
    data: bytes
    metadata: Any
    connected: bool = True
    fail_in_progress: bool = False
    sent: list[tuple[str, float | None]] = field(default_factory=list)  # (action, NAK delay) in order
    _changed: asyncio.Event | None = field(default=None, repr=False)

    @property
    def _client(self) -> Any:
        return SimpleNamespace(is_connected=self.connected)

    async def ack(self) -> None:
        self._send("ack", None)

    async def ack_sync(self, timeout: float = 1.0) -> None:
        self._send("ack", None)

    async def nak(self, delay: float | None = None) -> None:
        self._send("nak", delay)

    async def term(self) -> None:
        self._send("term", None)

    async def in_progress(self) -> None:
        if self.fail_in_progress:
            raise ConnectionError("stub: NATS is gone")
        self._send("in_progress", None)

    def _send(self, action: str, delay: float | None) -> None:
        self.sent.append((action, delay))
        if self._changed is not None:
            self._changed.set()

    async def until_sent(self, action: str, times: int = 1) -> None:
        """Until ``action`` was sent ``times`` times (awaited, not polled)."""
        while self.actions(ticks=True).count(action) < times:
            self._changed = asyncio.Event()
            await self._changed.wait()

    def actions(self, *, ticks: bool = False) -> list[str]:
        """What was sent, in order; ``in_progress`` ticks left out unless asked for."""
        return [a for a, _ in self.sent if ticks or a != "in_progress"]


@dataclass
class StubStream:
    """One stream's messages and their deliveries; ``deliver(seq)`` hands out the next one."""

    name: str = STUB_STREAM
    messages: dict[int, tuple[str, bytes, datetime]] = field(default_factory=dict)
    deliveries: dict[int, list[StubMsg]] = field(default_factory=dict)

    def publish(self, subject: str, data: bytes) -> int:
        seq = len(self.messages) + 1
        self.messages[seq] = (subject, data, datetime.now(UTC))
        self.deliveries[seq] = []
        return seq

    def deliver(self, seq: int, **msg: Any) -> StubMsg:
        """The next delivery of ``seq``; refused once it was acked or termed (JetStream would not)."""
        assert self.settled(seq) is None, f"seq {seq} was {self.settled(seq)}ed: JetStream delivers it no more"
        subject, data, stamp = self.messages[seq]
        delivered = len(self.deliveries[seq]) + 1
        metadata = SimpleNamespace(stream=self.name, sequence=SimpleNamespace(stream=seq, consumer=delivered),
                                   timestamp=stamp, num_delivered=delivered)
        out = StubMsg(subject, data, metadata, **msg)
        self.deliveries[seq].append(out)
        return out

    def settled(self, seq: int) -> str | None:
        """``ack`` or ``term`` once a delivery sent one, else None."""
        for delivery in self.deliveries[seq]:
            for action, _ in delivery.sent:
                if action in FINAL:
                    return action
        return None

    def redeliveries(self, seq: int) -> int:
        return max(len(self.deliveries[seq]) - 1, 0)

    async def until_settled(self, own: Callable[[JobConsumer, Any], Awaitable[None]], consumer: JobConsumer,
                            seq: int, *, max_deliveries: int = 20) -> str:
        """Deliver ``seq`` to ``own`` again and again, as JetStream redelivers, until it is acked or termed."""
        for _ in range(max_deliveries):
            await own(consumer, self.deliver(seq))
            if (final := self.settled(seq)) is not None:
                return final
        raise AssertionError(f"seq {seq} not settled after {max_deliveries} deliveries")


class MemoryRecords:
    """The fleet's per-message records (failure count, outcome ledger, lease) in memory, with the three
    views the holder is given over Redis: ``recall`` (``RedisRecall``), ``ledger``
    (``AsyncOutcomeLedger``) and ``counts`` (``FailureCounts``). ``down`` makes every read and write
    raise as an unreachable Redis does."""

    def __init__(self) -> None:
        self.failures: dict[MessageKey, int] = {}
        self.outcomes: dict[MessageKey, Disposition] = {}
        self.leases: dict[MessageKey, LeaseView] = {}
        self.down = False
        self.ledger = _Ledger(self)
        self.counts = _Counts(self)

    def check(self) -> None:
        if self.down:
            raise redis.exceptions.ConnectionError("stub: Redis is down")

    async def recall(self, meta: DeliveryMeta) -> History:
        if meta.delivered <= 1:  # as RedisRecall: a first delivery has no history to read
            return History()
        self.check()
        key = meta.key
        return History(self.failures.get(key, 0), self.outcomes.get(key),
                       self.leases.get(key, LeaseView(LeaseState.ABSENT)))


@dataclass
class _Ledger:
    records: MemoryRecords

    async def record(self, key: MessageKey, disposition: Disposition) -> None:
        self.records.check()
        self.records.outcomes[key] = disposition

    async def get(self, key: MessageKey) -> Disposition | None:
        self.records.check()
        return self.records.outcomes.get(key)


@dataclass
class _Counts:
    records: MemoryRecords
    outage: Outage = field(default_factory=lambda: Outage("Redis"))

    async def record(self, held: Any) -> int:
        """One more failed delivery; the delivery's recorded outcome is consumed with it."""
        self.records.check()
        failures = self.records.failures
        failures[held.key] = failures.get(held.key, 0) + 1
        self.records.outcomes.pop(held.key, None)
        return failures[held.key]

    async def consume_outcome(self, held: Any) -> None:
        self.records.check()
        self.records.outcomes.pop(held.key, None)

    async def clear(self, held: Any) -> None:
        self.records.check()
        self.records.failures.pop(held.key, None)
        self.records.outcomes.pop(held.key, None)


@dataclass
class StubRuns:
    """The pool as the holder sees it: each dispatched job's disposition, scripted per delivery.

    ``outcome(delivery) -> Disposition`` is what the task returns; ``gate``, when given, holds every
    task until it is set (a job that runs for a while); ``adopted`` answers an adopted task.
    """

    outcome: Callable[[int], Disposition]
    gate: asyncio.Event | None = None
    adopted: Disposition | None = None
    dispatched: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (delivery, payload)
    adoptions: list[int] = field(default_factory=list)

    async def dispatch(self, held: Any, meta: DeliveryMeta, payload: dict[str, Any]) -> Disposition:
        self.dispatched.append((meta.delivered, payload))
        if self.gate is not None:
            await self.gate.wait()
        return self.outcome(meta.delivered)

    async def adopt(self, held: Any, meta: DeliveryMeta) -> Disposition:
        self.adoptions.append(meta.delivered)
        assert self.adopted is not None, "no adopted outcome scripted"
        return self.adopted


@dataclass
class StubEnvelopes:
    """Failure envelopes as core would receive them; ``fail`` makes the publish fail (no ack from NATS)."""

    fail: bool = False
    published: list[tuple[int, Envelope]] = field(default_factory=list)  # (seq, envelope)

    async def publish(self, meta: DeliveryMeta, envelope: Envelope) -> bool:
        if self.fail:
            return False
        self.published.append((meta.seq, envelope))
        return True
