"""Cairn ack discipline end to end: what counts towards the term, MaxDeliver, responder deadlines.

A stack of its own (``tests.cairn_stack.CairnStack``: real bridge process, real
Celery provider workers, dev core, fake Strava) with settings that make the
rules quick to observe: a job is termed once it has *failed*
``TERM_AFTER_DELIVERIES - 1`` = 1 time, consumers have a finite MaxDeliver,
and discover / OAuth exchange have 2 s deadlines. The default stack
(``test_cairn_e2e.py``) keeps the defaults: unlimited MaxDeliver, a failing job
termed on its 5th delivery.

Rate limits are staged on the shared budget itself: :class:`SpentBudget`
keeps one app's short window in ``cairn_rate_limits`` spent with a reset about
a second ahead, so every reservation is refused with a ~1 s rate-limit NAK (the
real limiter's path, anchored to the window reset) until the test lets go.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import pytest
import redis

from devstack.fakes.cairn_core import DevCairnCore
from tests.kit.cairn_stack import LEASE_TTL_S, PROVIDER, WAIT_S, CairnStack
from tests.kit.celery_worker import CeleryWorker
from tests.kit.waiting import wait_until
from workers.cairn.contract import subjects
from workers.cairn.outcomes import FAILURES_PREFIX
from workers.cairn.ratelimit import WindowState

# slow: starts fleet processes (tests/kit/fleet_guard.py); one xdist worker runs the module, whose
# module-scoped stack is then started once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cairn_ack_e2e")]

TERM_AFTER_DELIVERIES = 2  # terms on arrival after one failed delivery
MAX_DELIVER = 8  # finite, above the term: its last delivery is termed by the bridge with an envelope
DEADLINE_S = 2.0  # CAIRN_DISCOVER_DEADLINE_S and CAIRN_EXCHANGE_DEADLINE_S
REPLY_MARGIN_S = 3.0  # a reply later than its deadline by more than this is a missing reply
SPENT_RESET_AHEAD_S = 1.0  # the spent window's reset is kept this far ahead: ~1 s rate-limit NAKs
SPENT_REFRESH_S = 0.2  # how often the spent window is rewritten (a cadence: there is no event to await)
RATE_LIMIT_NAK = re.compile(r"nak fetch_source seq (\d+) \(delivery (\d+)\) delay [\d.]+s: rate_limited[^\n]*")
STACK_ENV = {"CAIRN_TERM_AFTER_DELIVERIES": str(TERM_AFTER_DELIVERIES), "CAIRN_MAX_DELIVER": str(MAX_DELIVER),
             "CAIRN_DISCOVER_DEADLINE_S": str(DEADLINE_S), "CAIRN_EXCHANGE_DEADLINE_S": str(DEADLINE_S)}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    """Bridge only: each test starts or stops provider workers as it needs them."""
    s = CairnStack(tmp_path_factory.mktemp("cairn-ack"), redis_url, s3_endpoint, extra_env=STACK_ENV).start()
    try:
        s.start_bridge()
        yield s
    finally:
        s.stop()


def one_worker(stack: CairnStack) -> CeleryWorker:
    """Exactly one live provider worker (so a test knows which process runs its job)."""
    live = stack.live_workers()
    for extra in live[1:]:
        extra.stop()
    return live[0] if live else stack.start_worker()


def failures_for(core: DevCairnCore, ext_id: str) -> list[Any]:
    return [r for r in core.ingested if r.kind == "failure"
            and r.data.get("failedRef", {}).get("externalId") == ext_id]


class SpentBudget:
    """Keeps an app's short window spent (``used == capacity``), its reset always ~1 s ahead."""

    def __init__(self, nats_url: str, app_id: str) -> None:
        self.nats_url = nats_url
        self.key = subjects.rate_limit_key(PROVIDER, app_id, "short")
        self.primed, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        nc = await nats.connect(self.nats_url)
        try:
            kv = await nc.jetstream().key_value(subjects.RATE_LIMIT_BUCKET)
            while not self._stop.is_set():
                now = datetime.now(UTC)
                spent = WindowState(capacity=100, used=100, window_start=now,
                                    window_reset_at=now + timedelta(seconds=SPENT_RESET_AHEAD_S))
                await kv.put(self.key, spent.encode())
                self.primed.set()
                await asyncio.sleep(SPENT_REFRESH_S)
        finally:
            await nc.close()

    def __enter__(self) -> SpentBudget:
        self._thread.start()
        assert self.primed.wait(WAIT_S), "the spent window was never written"
        return self

    def release(self) -> None:
        """Stop spending: the last window resets within ~1 s and the next reservation succeeds."""
        self._stop.set()
        self._thread.join(WAIT_S)

    def __exit__(self, *exc: object) -> None:
        self.release()


def rate_limit_naks(log: str) -> list[re.Match[str]]:
    return list(RATE_LIMIT_NAK.finditer(log))


# --------------------------------------------------------------------------- tests
def test_consumers_are_created_with_the_configured_max_deliver(stack: CairnStack) -> None:
    for kind in ("fetch_source", "reconcile"):
        consumer = stack.consumer(kind)
        assert consumer["max_deliver"] == MAX_DELIVER, consumer
    assert stack.bridge is not None
    assert f"MaxDeliver {MAX_DELIVER}" in stack.bridge.log()


def test_discover_and_exchange_answer_an_error_before_their_deadline_when_no_worker_runs(
        stack: CairnStack) -> None:
    """Contract §8 (never an empty success) and §9b (answer within 20 s): nobody in the pool answers."""
    for worker in stack.live_workers():
        worker.stop()
    acct = stack.connect_athlete(n_activities=2)
    started = time.monotonic()
    reply = stack.core.discover(acct.account_id, timeout_s=DEADLINE_S + REPLY_MARGIN_S)
    assert time.monotonic() - started < DEADLINE_S + REPLY_MARGIN_S
    assert set(reply) == {"error"} and reply["error"], reply  # no items, no complete: not an empty success

    body = {"connection_id": str(uuid.uuid4()), "client_id": stack.strava.client_id,
            "client_secret": stack.strava.client_secret, "code": f"code-{uuid.uuid4().hex}",
            "redirect_uri": "http://127.0.0.1/auth/oauth/strava/callback"}
    started = time.monotonic()
    reply = stack.core.request(subjects.oauth_exchange_subject(PROVIDER, stack.pool), body,
                               DEADLINE_S + REPLY_MARGIN_S)
    assert time.monotonic() - started < DEADLINE_S + REPLY_MARGIN_S
    assert reply.get("error") == "transient" and reply.get("message"), reply
    assert "access_token" not in reply
    r = redis.Redis.from_url(stack.redis_url)
    assert not list(r.scan_iter("cairn:sealed:*")), "the parked exchange request outlived its deadline"


def test_a_job_rate_limited_more_often_than_the_term_is_ingested_once_the_budget_allows(
        stack: CairnStack) -> None:
    """Rate-limit NAKs wait for the window; they are not failures, so no term and no envelope."""
    one_worker(stack)
    acct = stack.connect_athlete(own_app=True)
    ext_id = stack.first_activity_id(acct)
    job = stack.fetch_job(acct, ext_id)
    core, bridge = stack.core, stack.bridge
    assert bridge is not None
    offset = len(bridge.log())
    with SpentBudget(stack.nats.url, acct.app_id):
        core.enqueue_job("fetch_source", job)
        wait_until(lambda: len(rate_limit_naks(bridge.log()[offset:])) > TERM_AFTER_DELIVERIES, WAIT_S,
                   "more rate-limit NAKs than the term allows failures")
    core.router.wait(lambda: bool(stack.results_for(job["job_id"])), WAIT_S, "the job's result")
    (result,) = stack.results_for(job["job_id"])
    naks = rate_limit_naks(bridge.log()[offset:])
    assert result.msg_id == f"result:{job['job_id']}:d{len(naks) + 1}"  # delivered after every wait
    assert len(naks) > TERM_AFTER_DELIVERIES and all("[failure" not in m.group(0) for m in naks)
    assert (PROVIDER, acct.account_id, ext_id) in core.router.sources
    assert not failures_for(core, ext_id)
    assert not re.search(rf"term fetch_source seq {naks[0].group(1)} ", bridge.log()[offset:])


def test_the_last_delivery_a_finite_max_deliver_allows_is_termed_with_an_envelope(stack: CairnStack) -> None:
    """C2 with an operator's finite MaxDeliver: a job that only ever waited is not dropped silently."""
    one_worker(stack)
    acct = stack.connect_athlete(own_app=True)
    ext_id = stack.first_activity_id(acct)
    job = stack.fetch_job(acct, ext_id)
    core, bridge = stack.core, stack.bridge
    assert bridge is not None
    with SpentBudget(stack.nats.url, acct.app_id):
        core.enqueue_job("fetch_source", job)
        core.router.wait(lambda: bool(failures_for(core, ext_id)), WAIT_S * 2, "the envelope")
    (envelope,) = failures_for(core, ext_id)
    assert envelope.data["error"]["code"] == "max_deliveries"
    assert envelope.msg_id == f"failed:{PROVIDER}:{ext_id}:d{MAX_DELIVER}"  # not at d2: waits did not count
    term = wait_until(lambda: re.search(rf"term fetch_source seq (\d+) \(delivery {MAX_DELIVER}\)",
                                        bridge.log()), WAIT_S, "the term")
    seq = int(term.group(1))
    assert not [d for d in core.dead_letters if d.stream_seq == seq]  # JetStream never gave up on it
    assert not stack.results_for(job["job_id"])


def test_a_task_lost_mid_run_counts_as_a_failure(stack: CairnStack) -> None:
    """A job that kills its worker is failing: with a term after one failure, its 2nd delivery is termed."""
    victim = one_worker(stack)
    acct = stack.connect_athlete()
    ext_id = stack.first_activity_id(acct)
    job = stack.fetch_job(acct, ext_id)
    stack.hold_at_the_gate(job)
    victim.kill()
    stack.gate.open()
    core, bridge = stack.core, stack.bridge
    assert bridge is not None
    core.router.wait(lambda: bool(failures_for(core, ext_id)), WAIT_S + 2 * LEASE_TTL_S, "the give-up envelope")
    (envelope,) = failures_for(core, ext_id)
    assert envelope.data["error"]["code"] == "max_deliveries"
    assert envelope.msg_id == f"failed:{PROVIDER}:{ext_id}:d2"
    log = bridge.log()
    lost = re.search(r"nak fetch_source seq (\d+) \(delivery 1\)[^\n]*lease expired: task lost[^\n]*\[failure 1 ",
                     log)
    assert lost, log[-3000:]
    seq = lost.group(1)
    wait_until(lambda: re.search(rf"term fetch_source seq {seq} \(delivery 2\)", bridge.log()), WAIT_S, "the term")
    assert not redis.Redis.from_url(stack.redis_url).exists(f"{FAILURES_PREFIX}{subjects.JOBS_STREAM}:{seq}")
    assert not stack.results_for(job["job_id"])

