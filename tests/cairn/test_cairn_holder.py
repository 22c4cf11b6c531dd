"""The Cairn bridge's decision core (``Holder``: admission → execution → settle) against the JetStream stub.

No server: the messages, the stream's redeliveries and the fleet's per-message records are the
in-process stand-ins of ``tests/kit/jetstream_stub.py``. What runs is the bridge's own code:
``Holder``, ``admit`` and ``settle``. The real servers prove the same paths end to end in
``test_cairn_ack_e2e.py`` and ``test_cairn_e2e.py``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from bridges.cairn.admission import DeliveryMeta, Rules, job_kind
from bridges.cairn.consumers import JobConsumer
from bridges.cairn.execution import Shutdown
from bridges.cairn.holder import Holder
from tests.kit.jetstream_stub import MemoryRecords, StubEnvelopes, StubRuns, StubStream
from workers.cairn.contract.subjects import FETCH_SOURCE, JOB_KINDS
from workers.cairn.disposition import (
    HANDOVER_NAK_DELAY_S,
    HISTORY_UNAVAILABLE_NAK_DELAY_S,
    MIN_NAK_DELAY_S,
    TASK_FAILURE_NAK_DELAY_S,
    Disposition,
    ack,
    nak,
    term,
)
from workers.lease import LeaseState, LeaseView
from workers.outage import Outage

TERM_AFTER = 5  # CAIRN_TERM_AFTER_DELIVERIES' default
KINDS = {k: job_kind(k, "1.0") for k in JOB_KINDS}
CONSUMER = JobConsumer(FETCH_SOURCE, "cairn.jobs.fetch_source.strava.pool", "pool-fetch_source")
SLOTS = 4
TICKS_SEEN_WITHIN_S = 5.0  # generous on a loaded box: three 10 ms ticks
QUICK_ACK_WAIT_S = 0.03  # in_progress every 10 ms: ticks show up within a test's few milliseconds


def job() -> bytes:
    return json.dumps({"job_id": f"job-{uuid.uuid4().hex[:8]}", "account_id": "acct-1", "user_id": "user-1",
                       "provider": "strava", "ext_id": "123"}).encode()


class Rig:
    """One holder wired to the stub stream, records, pool and envelope sink, as the bridge wires it."""

    def __init__(self, runs: StubRuns, *, envelopes: StubEnvelopes | None = None,
                 ack_wait_s: float = 30.0, max_deliver: int = -1) -> None:
        self.stream, self.records, self.runs = StubStream(), MemoryRecords(), runs
        self.envelopes = envelopes or StubEnvelopes()
        self.shutdown = Shutdown()
        self.slots = asyncio.Semaphore(SLOTS)
        self.holder = Holder(kinds=KINDS, rules=Rules(TERM_AFTER, max_deliver), recall=self.records.recall,
                             runs=runs, envelopes=self.envelopes, ledger=self.records.ledger,
                             failures=self.records.counts, shutdown=self.shutdown, slots=self.slots,
                             spawn=lambda coro, name: asyncio.ensure_future(coro), ack_wait_s=ack_wait_s,
                             redis_outage=Outage("Redis"), nats_outage=Outage("NATS"))

    async def own(self, consumer: JobConsumer, msg: Any) -> None:
        """As a pull loop hands a message over: a slot taken first, released by the holder."""
        await self.slots.acquire()
        await self.holder.own(consumer, msg)
        assert not self.holder.held, "a settled message is held no more"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_job_the_task_acks_is_acked_once_and_its_records_cleared() -> None:
    rig = Rig(StubRuns(lambda delivery: ack("imported")))
    seq = rig.stream.publish(CONSUMER.subject, job())
    assert run(rig.stream.until_settled(rig.own, CONSUMER, seq)) == "ack"
    assert rig.stream.redeliveries(seq) == 0
    assert [d for d, _ in rig.runs.dispatched] == [1]
    assert rig.runs.dispatched[0][1]["ext_id"] == "123"  # the parsed job is what the task receives
    assert rig.stream.deliveries[seq][0].actions() == ["ack"]
    assert not rig.records.failures and not rig.records.outcomes


def test_a_job_that_fails_every_time_is_termed_with_one_envelope_on_the_fifth_delivery() -> None:
    """C2: four counted NAKs with a delay, then envelope + term on arrival; the pool is not asked a fifth time."""
    rig = Rig(StubRuns(lambda delivery: nak(TASK_FAILURE_NAK_DELAY_S, reason="provider 500")))
    seq = rig.stream.publish(CONSUMER.subject, job())
    assert run(rig.stream.until_settled(rig.own, CONSUMER, seq)) == "term"
    deliveries = rig.stream.deliveries[seq]
    assert len(deliveries) == TERM_AFTER and rig.stream.redeliveries(seq) == TERM_AFTER - 1
    assert [d.sent for d in deliveries[:-1]] == [[("nak", TASK_FAILURE_NAK_DELAY_S)]] * (TERM_AFTER - 1)
    assert deliveries[-1].actions() == ["term"]
    assert [d for d, _ in rig.runs.dispatched] == [1, 2, 3, 4]
    [(published_seq, envelope)] = rig.envelopes.published
    assert published_seq == seq and envelope.code == "max_deliveries" and envelope.ref["job_id"].startswith("job-")
    assert not rig.records.failures and not rig.records.outcomes  # cleared once the term was sent


def test_waits_do_not_count_and_no_nak_goes_out_without_a_delay() -> None:
    """A rate-limit wait (no failure) never brings the term closer; a NAK of 0 s is sent as the minimum."""
    script = {1: nak(0.0, reason="rate limited", failure=False), 2: nak(None, reason="hand-over", failure=False),
              3: nak(0.0, reason="boom"), 4: ack()}
    rig = Rig(StubRuns(lambda delivery: script[delivery]))
    seq = rig.stream.publish(CONSUMER.subject, job())
    assert run(rig.stream.until_settled(rig.own, CONSUMER, seq)) == "ack"
    assert [d.sent for d in rig.stream.deliveries[seq]] == [
        [("nak", MIN_NAK_DELAY_S)], [("nak", MIN_NAK_DELAY_S)], [("nak", MIN_NAK_DELAY_S)], [("ack", None)]]
    assert [d for d, _ in rig.runs.dispatched] == [1, 2, 3, 4]


def test_poison_is_termed_with_an_envelope_at_once_and_the_pool_never_sees_it() -> None:
    rig = Rig(StubRuns(lambda delivery: ack()))
    seq = rig.stream.publish(CONSUMER.subject, b"\xff not json")
    assert run(rig.stream.until_settled(rig.own, CONSUMER, seq)) == "term"
    assert rig.stream.redeliveries(seq) == 0 and not rig.runs.dispatched
    [(_, envelope)] = rig.envelopes.published
    assert envelope.code == "bad_payload" and envelope.ref == {"job_id": f"{rig.stream.name}-{seq}"}


def test_a_term_whose_send_was_lost_is_applied_from_the_ledger_without_a_second_envelope() -> None:
    """C4: the envelope is out and the term recorded before it is sent; NATS dropped it (disconnected),
    so JetStream redelivers, and the redelivery applies the recorded term."""
    rig = Rig(StubRuns(lambda delivery: ack()))
    seq = rig.stream.publish(CONSUMER.subject, b"[]")  # JSON, not an object: poison

    async def scenario() -> None:
        await rig.own(CONSUMER, rig.stream.deliver(seq, connected=False))
        assert rig.stream.settled(seq) is None  # not sent: nats-py would only have buffered it
        assert list(rig.records.outcomes.values())[0].action == "term"
        await rig.own(CONSUMER, rig.stream.deliver(seq))

    run(scenario())
    assert rig.stream.settled(seq) == "term" and rig.stream.redeliveries(seq) == 1
    assert len(rig.envelopes.published) == 1 and not rig.runs.dispatched


def test_an_envelope_that_cannot_be_published_is_no_term() -> None:
    """No term without its envelope: core must hear why the job ended. A NAK instead, nothing recorded."""
    rig = Rig(StubRuns(lambda delivery: ack()), envelopes=StubEnvelopes(fail=True))
    seq = rig.stream.publish(CONSUMER.subject, b"{}")
    run(rig.own(CONSUMER, rig.stream.deliver(seq)))
    assert rig.stream.deliveries[seq][0].actions() == ["nak"] and rig.stream.settled(seq) is None
    assert not rig.records.outcomes


def test_every_held_message_gets_in_progress_until_its_disposition_and_none_after() -> None:
    """C1: ticks below AckWait while the task runs; none once the message is settled."""

    async def scenario() -> tuple[int, int]:
        gate = asyncio.Event()
        rig = Rig(StubRuns(lambda delivery: ack(), gate=gate), ack_wait_s=QUICK_ACK_WAIT_S)
        seq = rig.stream.publish(CONSUMER.subject, job())
        msg = rig.stream.deliver(seq)
        owner = asyncio.ensure_future(rig.own(CONSUMER, msg))
        await asyncio.wait_for(msg.until_sent("in_progress", 3), TICKS_SEEN_WITHIN_S)
        gate.set()
        await owner
        ticks = msg.actions(ticks=True).count("in_progress")
        await asyncio.sleep(QUICK_ACK_WAIT_S)
        assert msg.actions() == ["ack"] and msg.actions(ticks=True)[-1] == "ack"
        return ticks, msg.actions(ticks=True).count("in_progress")

    during, after = run(scenario())
    assert during >= 3 and after == during


def test_a_redelivery_whose_task_still_runs_is_adopted_not_dispatched() -> None:
    rig = Rig(StubRuns(lambda delivery: ack(), adopted=ack("the first task finished")))
    seq = rig.stream.publish(CONSUMER.subject, job())

    async def scenario() -> None:
        first = rig.stream.deliver(seq)
        await first.nak(1.0)  # the bridge holding it died after a hand-over; its task runs on
        rig.records.leases[first_key(rig, seq)] = LeaseView(LeaseState.RUNNING, "token")
        await rig.own(CONSUMER, rig.stream.deliver(seq))

    run(scenario())
    assert rig.runs.adoptions == [2] and not rig.runs.dispatched and rig.stream.settled(seq) == "ack"


def first_key(rig: Rig, seq: int) -> Any:
    return DeliveryMeta.from_msg(CONSUMER.kind, rig.stream.deliveries[seq][0]).key


def test_redis_down_hands_the_message_back_without_counting_it() -> None:
    """R1: unknown history is never "no history": a NAK that is no failure, and the pool is not asked."""
    rig = Rig(StubRuns(lambda delivery: ack()))
    seq = rig.stream.publish(CONSUMER.subject, job())

    async def scenario() -> None:
        await rig.stream.deliver(seq).nak(1.0)  # a first delivery reads no history: start at the second
        rig.records.down = True
        await rig.own(CONSUMER, rig.stream.deliver(seq))

    run(scenario())
    assert rig.stream.deliveries[seq][1].sent == [("nak", HISTORY_UNAVAILABLE_NAK_DELAY_S)]
    assert not rig.runs.dispatched
    rig.records.down = False
    assert not rig.records.failures


def test_a_bug_in_the_bridge_is_a_counted_failure_so_it_ends_in_a_term() -> None:
    def explode(delivery: int) -> Disposition:
        raise RuntimeError("a bug between admission and settle")

    rig = Rig(StubRuns(explode))
    seq = rig.stream.publish(CONSUMER.subject, job())
    assert run(rig.stream.until_settled(rig.own, CONSUMER, seq)) == "term"
    assert rig.stream.redeliveries(seq) == TERM_AFTER - 1
    assert {d.sent[0] for d in rig.stream.deliveries[seq][:-1]} == {("nak", TASK_FAILURE_NAK_DELAY_S)}


def test_a_stopping_bridge_hands_new_arrivals_on_without_running_them() -> None:
    rig = Rig(StubRuns(lambda delivery: term("never")))
    rig.shutdown.begin(grace_s=1.0)
    seq = rig.stream.publish(CONSUMER.subject, job())
    run(rig.own(CONSUMER, rig.stream.deliver(seq)))
    assert rig.stream.deliveries[seq][0].sent == [("nak", HANDOVER_NAK_DELAY_S)]
    assert not rig.runs.dispatched and not rig.records.failures
