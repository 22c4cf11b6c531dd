"""Hearing every task's outcome: one pub/sub connection, and the reads before a task is called lost.

Against a real Redis with the Celery Redis result backend's own key names and
encoding. The task side is played by the sender the bridge is given: it does
what ``run_job`` and Celery do, in their order (take the lease, record the
outcome, release, store the result), but stores the result *without* its
pub/sub message — the message a bridge can miss.

Observed defect 3: right after start, two waiters' first subscriptions raced
on a not-yet-connected ``redis.asyncio`` PubSub and one result was never heard
(``test_two_results_right_after_start_are_both_heard`` failed on old main,
hearing 1 of 2). And nothing read the stored result before a lost-task NAK.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import redis
from celery import Celery, states

from bridges.cairn.admission import DeliveryMeta
from bridges.cairn.consumers import JobConsumer
from bridges.cairn.execution import Execution, Shutdown
from bridges.cairn.results import TaskResults
from bridges.cairn.settle import Held
from tasks.hardening.result_backend import result_backend_url
from workers.cairn.contract.subjects import JOBS_STREAM
from workers.cairn.disposition import ack, term
from workers.cairn.outcomes import LEASE_NAMESPACE, MessageKey, OutcomeLedger
from workers.lease import LeaseKeeper, Leases, LeaseState
from workers.redisconn import async_client

HEARD_WITHIN_S = 5.0
START_DEADLINE_S = 30.0
LEASE_TTL_S = 2.0
CONSUMER = JobConsumer("fetch_source", "cairn.jobs.fetch_source.strava.pool", "pool_fetch_source")


def test_two_results_right_after_start_are_both_heard(fresh_redis: str) -> None:
    app = Celery("results-race", broker=fresh_redis, backend=result_backend_url(fresh_redis))  # the fleet's backend

    async def scenario() -> int:
        results = TaskResults(app.backend, fresh_redis)  # fresh: its pub/sub has no connection yet
        try:
            ids = [f"race-{uuid.uuid4().hex}" for _ in range(2)]
            watches = await asyncio.gather(*(results.watch(i) for i in ids))
            for task_id in ids:
                await asyncio.to_thread(app.backend.store_result, task_id, ack().model_dump(), states.SUCCESS)
            done, _ = await asyncio.wait([w.done for w in watches], timeout=HEARD_WITHIN_S)
            return len(done)
        finally:
            await results.close()

    for _ in range(3):  # it failed on every start before the fix
        assert asyncio.run(scenario()) == 2


def _meta() -> DeliveryMeta:
    return DeliveryMeta(kind="fetch_source", stream=JOBS_STREAM, seq=uuid.uuid4().int % 10**9 + 1,
                        stamp=1_770_000_000.25, delivered=1, subject=CONSUMER.subject)


class SilentTask:
    """The task side, finishing while the bridge is not listening (its result is stored, not published)."""

    def __init__(self, app: Celery, url: str, *, store_result: bool) -> None:
        self.app, self.store_result = app, store_result
        self.client = redis.Redis.from_url(url)
        self.leases = Leases(self.client, LEASE_NAMESPACE)
        self.ledger = OutcomeLedger(self.client)
        self.outcome = term("not_found: activity gone")

    def __call__(self, kind: str, job: dict[str, Any], meta: dict[str, Any], task_id: str) -> None:
        key = MessageKey.from_meta(meta)
        running = self.leases.take(key.id, meta["lease_token"], LEASE_TTL_S)
        assert running is not None
        with LeaseKeeper(self.leases, key.id, running, LEASE_TTL_S):
            self.ledger.record(key, self.outcome)
        self.leases.release(key.id, running)
        if self.store_result:  # as the Redis backend stores it, minus the PUBLISH
            body = {"status": states.SUCCESS, "result": self.outcome.model_dump(), "traceback": None,
                    "children": [], "date_done": None, "task_id": task_id}
            self.client.set(self.app.backend.get_key_for_task(task_id), json.dumps(body))


def _dispatch(url: str, send: SilentTask) -> tuple[Any, MessageKey]:
    async def scenario() -> tuple[Any, MessageKey]:
        aredis = async_client(url)
        results = TaskResults(send.app.backend, url)
        execution = Execution(send, results, send.leases, aredis, START_DEADLINE_S, Shutdown())
        meta = _meta()
        held = Held(CONSUMER, None, meta.delivered, meta.seq)  # type: ignore[arg-type]  # no NATS message here
        try:
            await results.start()
            return await asyncio.wait_for(execution.dispatch(held, meta, {"job_id": "j"}), 30.0), meta.key
        finally:
            await results.close()
            await aredis.aclose()
    return asyncio.run(scenario())


def test_a_result_whose_message_was_missed_is_read_before_the_task_is_called_lost(fresh_redis: str) -> None:
    app = Celery("fallback", broker=fresh_redis, backend=result_backend_url(fresh_redis))  # the fleet's backend
    send = SilentTask(app, fresh_redis, store_result=True)
    disposition, key = _dispatch(fresh_redis, send)
    assert disposition == send.outcome  # not "lease expired: task lost"
    assert send.leases.state(key.id).state is LeaseState.ABSENT


def test_an_outcome_only_in_the_ledger_is_applied_too(fresh_redis: str) -> None:
    app = Celery("fallback-ledger", broker=fresh_redis, backend=result_backend_url(fresh_redis))  # the fleet's backend
    send = SilentTask(app, fresh_redis, store_result=False)
    disposition, _ = _dispatch(fresh_redis, send)
    assert disposition == send.outcome
