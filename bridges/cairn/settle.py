"""The bridge's ack discipline (contract §3): applying a disposition, and counting failed deliveries."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from nats.aio.msg import Msg

from bridges.cairn.consumers import JobConsumer
from workers.cairn.disposition import MIN_NAK_DELAY_S, Disposition
from workers.cairn.outcomes import MessageKey, failures_key, ledger_key
from workers.logs import redact
from workers.outage import REDIS_UNAVAILABLE, Outage

log = logging.getLogger(__name__)

# Every NAK carries a delay (MIN_NAK_DELAY_S at least): MaxDeliver is unlimited by default, so a NAK
# without one would be redelivered at once, for ever.
FAILURE_COUNT_TTL_S = 7 * 24 * 3600  # a week: outlives a day-long rate-limit NAK and what follows it
ACK_CONFIRM_TIMEOUT_S = 5.0  # how long an ack waits for JetStream to confirm it before the ledger is cleared


class Counts(Protocol):
    """Failed deliveries per message (:class:`FailureCounts`; a test's in-memory records)."""

    outage: Outage

    async def record(self, held: Held) -> int: ...

    async def consume_outcome(self, held: Held) -> None: ...

    async def clear(self, held: Held) -> None: ...


class NotSentError(Exception):
    """NATS is disconnected: the ack/term would only be buffered, so it is not sent now."""


@dataclass
class Held:
    """One fetched message the bridge owns until its disposition."""

    consumer: JobConsumer
    msg: Msg
    delivery: int
    seq: int
    arrived: float = field(default_factory=time.monotonic)
    token: str | None = None
    running: bool = False
    settled: bool = False
    failures: int = 0  # failed deliveries before this one (read from Redis on arrival)

    @property
    def key(self) -> MessageKey:
        meta = self.msg.metadata
        return MessageKey(str(meta.stream or self.consumer.stream), self.seq, meta.timestamp.timestamp())


class FailureCounts:
    """Failed deliveries per message in Redis, shared by every bridge instance of the pool.

    Failures, not deliveries: the contract terms a *persistently failing* job after ~5, while a
    rate limit is a NAK anchored to its window; ``num_delivered`` counts both, and a reconcile's
    sub-jobs waiting out a budget would be termed. A NAK counts only when its builder says so
    (``Disposition.counts_as_failure``). Kept in Redis beside the lease and ledger under the same
    ``MessageKey``, as the next delivery may reach another instance; deleted on ack or term.

    A first delivery has no count to read (nothing failed before it), which
    keeps the Redis read off the hot path of nearly every job.
    """

    def __init__(self, client: Any, *, redis_outage: Outage | None = None) -> None:
        self._r = client  # redis.asyncio.Redis
        self.outage = redis_outage or Outage("Redis")

    def key(self, held: Held) -> str:
        return failures_key(held.key)

    async def count(self, held: Held) -> int:
        if held.delivery <= 1:
            return 0
        raw = await self._r.get(self.key(held))
        return int(raw) if raw else 0

    async def record(self, held: Held) -> int:
        """One more failed delivery; the TTL restarts so a slowly failing job keeps its count.

        The recorded outcome of this delivery is consumed in the same transaction.
        """
        key = self.key(held)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.incr(key)
            pipe.expire(key, FAILURE_COUNT_TTL_S)
            pipe.delete(ledger_key(held.key))
            count, _, _ = await pipe.execute()
        return int(count)

    async def consume_outcome(self, held: Held) -> None:
        """A NAK that is no failure: the redelivery must run the job, not re-apply this outcome."""
        await self._r.delete(ledger_key(held.key))

    async def clear(self, held: Held) -> None:
        """The message is settled for good: its count and its recorded outcome go."""
        await self._r.delete(self.key(held), ledger_key(held.key))


async def _send(held: Held, action: str, delay_s: float) -> None:
    """Send the disposition. An ack is confirmed by JetStream (``ack_sync``) and an ack or term is
    never sent while NATS is disconnected: nats-py would buffer it and report success, the
    ledger would be cleared, and a redelivery arriving before the buffered ack would run the
    job a second time (C4). Left unsent, the redelivery applies the recorded outcome instead."""
    if action == "nak":
        await held.msg.nak(delay=delay_s)
        return
    client = getattr(held.msg, "_client", None)
    if client is not None and not client.is_connected:
        raise NotSentError("NATS disconnected")
    if action == "ack":
        await held.msg.ack_sync(timeout=ACK_CONFIRM_TIMEOUT_S)
    else:
        await held.msg.term()


def _report(failures: Counts, what: str, held: Held, exc: Exception) -> None:
    if isinstance(exc, REDIS_UNAVAILABLE):
        failures.outage.failed(what, exc)  # logged once per outage
    else:
        log.warning("%s for seq %d failed: %s", what, held.seq, type(exc).__name__)


async def settle(held: Held, disposition: Disposition, failures: Counts, term_after: int) -> None:
    """Apply ``disposition`` to the held message once; count a failed NAK before sending it.

    The count is written before the NAK so the redelivery, on whichever
    instance, already sees it. A count that cannot be written (Redis down) is
    reported and the NAK still goes out: one missed count only delays the term
    by a delivery. The ledger entry and count of an acked or termed message are
    deleted only once the ack or term was sent (an ack: confirmed).
    """
    if held.settled:
        return
    held.settled = True
    action, note = disposition.action, ""
    delay_s = max(disposition.delay_s or 0.0, MIN_NAK_DELAY_S) if action == "nak" else 0.0
    if action == "nak":
        try:
            if disposition.counts_as_failure:
                note = f" [failure {await failures.record(held)} of {max(term_after - 1, 1)} before the term]"
            else:
                await failures.consume_outcome(held)
            failures.outage.ok()
        except Exception as exc:  # noqa: BLE001 - never hold a message back for its count
            _report(failures, "failure count", held, exc)
    try:
        await _send(held, action, delay_s)
    except Exception as exc:  # noqa: BLE001 - JetStream redelivers after AckWait; the ledger still says what to do
        log.warning("%s for seq %d not sent (%s); its redelivery applies the recorded outcome",
                    action, held.seq, type(exc).__name__)
        return
    if action != "nak":
        try:
            await failures.clear(held)
        except Exception as exc:  # noqa: BLE001 - the keys expire on their own
            _report(failures, "clearing the message's records", held, exc)
    log.info("%s %s seq %d (delivery %d)%s%s%s", action, held.consumer.kind, held.seq, held.delivery,
             f" delay {delay_s:.1f}s" if delay_s else "",
             f": {redact(disposition.reason)}" if disposition.reason else "", note)
