"""The bridge's ack discipline (contract §3): applying a disposition, and counting failed deliveries.

Why count failures and not deliveries: the contract terms "after ~5 deliveries
of a *persistently failing* job", while a provider rate limit is a NAK "with
delay anchored to the limit window". JetStream's ``num_delivered`` counts
both, so a reconcile that enqueued hundreds of sub-jobs against a
100-requests/15-min budget would see most of them termed after five waits and
lost. A NAK is a failure only when its builder says so
(``Disposition.counts_as_failure``): a transient error from the task, or a task
lost mid-run (a job that kills its worker every time is persistently failing).
Rate-limit NAKs, parser refusals, hand-overs at shutdown and tasks that were
never started do not count.

Why Redis: every bridge instance of the pool binds the same durables, so the
next delivery of a job may reach another instance; the count lives beside the
job leases, keyed by the message's stream sequence (what identifies the
message across redeliveries), and is deleted when the message is acked or
termed. Its TTL outlives any redelivery we schedule (the longest NAK delay is
a daily window), so a forgotten key expires instead of piling up.

Why every NAK has a delay: consumers have unlimited MaxDeliver by default
(as the real Strava worker's), so a NAK without delay would be redelivered at
once, for ever: a hot loop.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from nats.aio.msg import Msg

from bridges.cairn_pool import STREAM_JOBS, JobConsumer
from workers.cairn.disposition import Disposition
from workers.logs import redact

log = logging.getLogger(__name__)

FAILURES_PREFIX = "sy:cairn:failures:"
FAILURE_COUNT_TTL_S = 7 * 24 * 3600  # a week: outlives a day-long rate-limit NAK and what follows it
MIN_NAK_DELAY_S = 1.0  # no NAK goes out faster: with unlimited MaxDeliver an instant NAK is a hot loop


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


class FailureCounts:
    """Failed deliveries per message in Redis, shared by every bridge instance of the pool.

    A message is named by its stream sequence *and* its stream timestamp: a
    stream that core deletes and recreates starts its sequences at 1 again,
    and a week-old count under a reused sequence must not doom a new job. The
    timestamp is the same on every redelivery of one message. A first delivery
    has no count to read (nothing failed before it), which keeps the Redis read
    off the hot path of nearly every job.
    """

    def __init__(self, client: Any, stream: str = STREAM_JOBS) -> None:
        self._r = client  # redis.asyncio.Redis
        self._stream = stream

    def key(self, held: Held) -> str:
        stamp = held.msg.metadata.timestamp
        return f"{FAILURES_PREFIX}{self._stream}:{held.seq}:{stamp.timestamp():.6f}"

    async def count(self, held: Held) -> int:
        if held.delivery <= 1:
            return 0
        raw = await self._r.get(self.key(held))
        return int(raw) if raw else 0

    async def record(self, held: Held) -> int:
        """One more failed delivery; the TTL restarts so a slowly failing job keeps its count."""
        key = self.key(held)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.incr(key)
            pipe.expire(key, FAILURE_COUNT_TTL_S)
            count, _ = await pipe.execute()
        return int(count)

    async def clear(self, held: Held) -> None:
        await self._r.delete(self.key(held))


def gives_up(failures: int, term_after_deliveries: int) -> bool:
    """Term on arrival once the job has failed ``term_after_deliveries - 1`` times.

    So a job that fails on every delivery is termed with its envelope on
    delivery ``term_after_deliveries`` (the 5th by default), as before, while
    deliveries that only waited (rate limit, refusal, hand-over) add nothing.
    """
    return failures >= term_after_deliveries - 1


async def settle(held: Held, disposition: Disposition, failures: FailureCounts, term_after: int) -> None:
    """Apply ``disposition`` to the held message once; count a failed NAK before sending it.

    The count is written before the NAK so the redelivery, on whichever
    instance, already sees it. A count that cannot be written is logged and
    the NAK still goes out: one missed count only delays the term by a delivery.
    """
    if held.settled:
        return
    held.settled = True
    action, note = disposition.action, ""
    delay_s = max(disposition.delay_s or 0.0, MIN_NAK_DELAY_S) if action == "nak" else 0.0
    if action == "nak" and disposition.counts_as_failure:
        try:
            note = f" [failure {await failures.record(held)} of {max(term_after - 1, 1)} before the term]"
        except Exception as exc:  # noqa: BLE001 - never hold a message back for its count
            log.warning("failure count for seq %d not recorded: %s", held.seq, type(exc).__name__)
    try:
        if action == "ack":
            await held.msg.ack()
        elif action == "term":
            await held.msg.term()
        else:
            await held.msg.nak(delay=delay_s)
    except Exception as exc:  # noqa: BLE001 - JetStream redelivers after AckWait anyway
        log.warning("%s for seq %d failed: %s", action, held.seq, type(exc).__name__)
        return
    if action != "nak" and held.failures:
        try:
            await failures.clear(held)
        except Exception as exc:  # noqa: BLE001 - the key expires on its own
            log.warning("failure count for seq %d not cleared: %s", held.seq, type(exc).__name__)
    log.info("%s %s seq %d (delivery %d)%s%s%s", action, held.consumer.kind, held.seq, held.delivery,
             f" delay {delay_s:.1f}s" if delay_s else "",
             f": {redact(disposition.reason)}" if disposition.reason else "", note)
