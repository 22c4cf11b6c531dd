"""The pull loops against a real JetStream: an idle consumer's long poll never starves a busy one.

The bridge has one pull loop per durable (fetch_source, reconcile, parse_blob, import_gear...)
sharing ``CAIRN_MAX_IN_FLIGHT`` slots. A loop used to take a slot *before* its fetch, so a loop
polling an empty consumer held that slot for the whole poll: with fewer free slots than idle
consumers, every job of the busy one waited out the other loops' polls in turn (about 6 s a job
with one slot and four consumers; issue 15 §3, found by the capacity runs). Here the polls of the
idle consumers last far longer than the test waits, so only a loop that leaves slots alone passes.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import nats
import pytest
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from bridges.cairn import pull
from bridges.cairn.consumers import JobConsumer, consumer_config
from bridges.cairn.execution import Shutdown
from bridges.cairn.pull import PullLoops
from workers.outage import Outage

JOBS = 5
IDLE_CONSUMERS = 3
ACK_WAIT_S = 30.0
LONG_POLL_S = 60.0  # longer than the test waits: a slot held by an idle poll is never given back in time
WAIT_S = 20.0


@pytest.fixture()
def long_polls(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(pull, "FETCH_WAIT_S", LONG_POLL_S)
    yield


async def _run(nats_url: str, slots: int) -> tuple[list[str], int]:
    """``JOBS`` messages on one consumer, none on the others; each job ends the moment it is taken."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    stream = f"PULL_{uuid.uuid4().hex[:8].upper()}"
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream.lower()}.>"]))
    consumers = [JobConsumer(kind, f"{stream.lower()}.{kind}", f"{stream.lower()}_{kind}", stream)
                 for kind in ["busy", *(f"idle{i}" for i in range(IDLE_CONSUMERS))]]
    for consumer in consumers:
        await js.add_consumer(stream, consumer_config(consumer, ACK_WAIT_S, -1))
    for i in range(JOBS):
        await js.publish(consumers[0].subject, f"job-{i}".encode())

    semaphore = asyncio.Semaphore(slots)
    taken: list[str] = []
    most_held = 0
    all_taken = asyncio.Event()

    def take(consumer: JobConsumer, msg: Msg) -> None:  # the bridge's part: own it, settle it, free the slot
        nonlocal most_held
        most_held = max(most_held, slots - semaphore._value)  # noqa: SLF001 - the test's own semaphore

        async def settle() -> None:
            await msg.ack()
            taken.append(msg.data.decode())
            semaphore.release()
            if len(taken) == JOBS:
                all_taken.set()

        asyncio.get_running_loop().create_task(settle())

    shutdown = Shutdown()
    loops = PullLoops(consumers, semaphore, shutdown, Outage("NATS"), take, tick_s=ACK_WAIT_S / 3)
    loops.start(js, lambda task: None)
    try:
        await asyncio.wait_for(all_taken.wait(), WAIT_S)
    finally:
        shutdown.begin(0.0)
        for task in loops.tasks:
            task.cancel()
        await asyncio.gather(*loops.tasks, return_exceptions=True)
        await js.delete_stream(stream)
        await nc.close()
    return taken, most_held


@pytest.mark.parametrize("slots", [1, 2])
def test_an_idle_consumers_poll_holds_no_slot_a_busy_one_needs(nats_url: str, long_polls: None,
                                                                slots: int) -> None:
    taken, most_held = asyncio.run(_run(nats_url, slots))
    assert sorted(taken) == [f"job-{i}" for i in range(JOBS)]
    assert most_held <= slots  # and never more jobs at once than the slots
