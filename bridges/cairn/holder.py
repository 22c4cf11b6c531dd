"""The bridge's decision core: one pulled message held from arrival to its disposition."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

from nats.aio.msg import Msg

from bridges.cairn.admission import Adopt, DeliveryMeta, Dispatch, Envelope, MessageKind, Recall, Rules, Settle, admit
from bridges.cairn.consumers import JobConsumer
from bridges.cairn.execution import Shutdown
from bridges.cairn.settle import Counts, Held, settle
from workers.cairn.disposition import (
    ENVELOPE_FAILED_NAK_DELAY_S,
    HANDOVER_NAK_DELAY_S,
    REDIS_DOWN_NAK_DELAY_S,
    TASK_FAILURE_NAK_DELAY_S,
    Disposition,
    nak,
)
from workers.cairn.outcomes import MessageKey
from workers.logs import redact
from workers.outage import REDIS_UNAVAILABLE, Outage

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[Any]"]  # the bridge tracks what it spawns


class Runs(Protocol):
    """Where an admitted job runs (``bridges.cairn.execution.Execution``)."""

    async def dispatch(self, held: Held, meta: DeliveryMeta, payload: dict[str, Any]) -> Disposition: ...

    async def adopt(self, held: Held, meta: DeliveryMeta) -> Disposition: ...


class Publishes(Protocol):
    """Where the failure envelope of a term the bridge decides itself goes (``bridges.cairn.envelopes``)."""

    async def publish(self, meta: DeliveryMeta, envelope: Envelope) -> bool: ...


class Records(Protocol):
    """The outcome ledger (``workers.cairn.outcomes.AsyncOutcomeLedger``)."""

    async def record(self, key: MessageKey, disposition: Disposition) -> None: ...


class Holder:
    """Holds each fetched message until it is acked, NAKed or termed (contract §3 ack discipline, C1, C2, C4).

    * every held message gets ``in_progress`` every ``AckWait/3``, whatever it is waiting for (C1);
    * :func:`bridges.cairn.admission.admit` is the only place anything is judged: dispatch, adopt a
      dead bridge's running task, or settle now (a recorded outcome, an envelope + term, a NAK);
    * a term the bridge decides itself publishes the failure envelope first and records the term in
      the outcome ledger before sending it, so a bridge killed in between never publishes a second one;
    * anything that escapes all of that is a *failed* delivery (a NAK that counts), so even a bug in
      the bridge ends in envelope + term after ~5 deliveries; Redis being unreachable is no bug: a
      NAK that does not count (R1).
    """

    def __init__(self, *, kinds: Mapping[str, MessageKind], rules: Rules, recall: Recall, runs: Runs,
                 envelopes: Publishes, ledger: Records, failures: Counts, shutdown: Shutdown,
                 slots: asyncio.Semaphore, spawn: Spawn, ack_wait_s: float,
                 redis_outage: Outage, nats_outage: Outage) -> None:
        self.kinds, self.rules, self.recall, self.runs = kinds, rules, recall, runs
        self.envelopes, self.ledger, self.failures = envelopes, ledger, failures
        self.shutdown, self.slots, self.spawn = shutdown, slots, spawn
        self.tick_s = ack_wait_s / 3  # in_progress below AckWait
        self.redis_outage, self.nats_outage = redis_outage, nats_outage
        self.held: dict[tuple[str, int], Held] = {}

    def take(self, consumer: JobConsumer, msg: Msg) -> None:
        """A pull loop fetched ``msg`` within a free slot: held from here until its disposition."""
        self.spawn(self.own(consumer, msg), f"held-{consumer.kind}")

    async def own(self, consumer: JobConsumer, msg: Msg) -> None:
        """Admission → execution → settle for one message; releases its slot at the end."""
        meta = DeliveryMeta.from_msg(consumer.kind, msg)
        held = Held(consumer, msg, meta.delivered, meta.seq)
        self.held[(meta.stream, meta.seq)] = held
        ticker = asyncio.create_task(self._keep_alive(held))
        try:
            if self.shutdown.stopping:
                disposition = nak(HANDOVER_NAK_DELAY_S, reason="bridge shutting down", failure=False)
            else:
                disposition = await self._decide(held, meta, msg.data)
            await self._settle(held, disposition)
        except REDIS_UNAVAILABLE as exc:  # not the job's failure and not a bug: hand it back for later
            self.redis_outage.failed(f"{meta.kind} seq {meta.seq}", exc)
            await self._settle(held, nak(REDIS_DOWN_NAK_DELAY_S, reason="no Redis", failure=False))
        except Exception as exc:  # noqa: BLE001 - never leave a message without disposition
            # Counted as a failure: whatever keeps failing here ends in envelope + term (C2).
            log.exception("%s seq %d failed in the bridge: %s", meta.kind, meta.seq, redact(str(exc)))
            await self._settle(held, nak(TASK_FAILURE_NAK_DELAY_S, reason="bridge error", failure=True))
        finally:
            ticker.cancel()
            self.held.pop((meta.stream, meta.seq), None)
            self.slots.release()

    async def _decide(self, held: Held, meta: DeliveryMeta, raw: bytes) -> Disposition:
        verdict = await admit(raw, meta, kinds=self.kinds, recall=self.recall, rules=self.rules)
        held.failures = verdict.history.failures
        if isinstance(verdict, Dispatch):
            return await self.runs.dispatch(held, meta, verdict.payload)
        if isinstance(verdict, Adopt):
            return await self.runs.adopt(held, meta)
        assert isinstance(verdict, Settle)
        if verdict.recorded:
            log.info("%s seq %d (delivery %d): applying the recorded outcome, not running it again",
                     meta.kind, meta.seq, meta.delivered)
        if verdict.envelope is None:
            return verdict.disposition
        if not await self.envelopes.publish(meta, verdict.envelope):
            return nak(ENVELOPE_FAILED_NAK_DELAY_S, reason=f"failure envelope not published: {verdict.envelope.code}")
        try:
            await self.ledger.record(meta.key, verdict.disposition)  # a redelivery terms without a second envelope
        except REDIS_UNAVAILABLE as exc:  # the envelope is out: term now rather than NAK and publish it again
            self.redis_outage.failed("recording a term", exc)
        return verdict.disposition

    async def _keep_alive(self, held: Held) -> None:
        """C1: in_progress from arrival until disposition, below AckWait."""
        while not held.settled:
            await asyncio.sleep(self.tick_s)
            if held.settled:
                return
            try:
                await held.msg.in_progress()
            except Exception as exc:  # noqa: BLE001 - keep trying; a lost tick is not fatal
                self.nats_outage.failed(f"in_progress for seq {held.seq}", exc)

    async def _settle(self, held: Held, disposition: Disposition) -> None:
        await settle(held, disposition, self.failures, self.rules.term_after_deliveries)
