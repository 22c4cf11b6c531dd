"""Issue 9 end to end: nothing loops for ever, nothing is done twice when the bridge dies (C2, C4).

A stack of its own (``tests.cairn_stack.CairnStack``): real ``python -m bridges
cairn`` processes, a real Celery provider worker, nats-server with JetStream,
Redis, the dev Cairn core and the fake Strava behind a gate.

Each test here failed on old main:

* observed defect 1 — deeply nested JSON and a ``min_parser_version`` that is not
  ``N.M`` were NAKed "bridge error" every 2 s for ever (here: termed with an
  envelope); 16 of them held the pool; the responders did not answer such requests;
* observed defect 2 — a bridge SIGKILLed between its task's result and its ack:
  the redelivery ran the job again (a second Strava fetch, ``result:<job>:d2``).
  Here it is acked from the outcome ledger and core stores one result msg-id;
  a task still running when its bridge died is adopted by the next bridge, not re-run.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import uuid
from collections.abc import Iterator
from typing import Any

import nats
import pytest
import redis

from devstack.infra.procs import Proc, freeze
from tests.kit.cairn_stack import PROVIDER, WAIT_S, CairnStack, running_stack
from tests.kit.waiting import wait_until
from workers.cairn.contract import subjects
from workers.cairn.outcomes import OUTCOME_PREFIX

# slow: starts fleet processes (tests/kit/fleet_guard.py); one xdist worker runs the module, whose
# module-scoped stack is then started once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cairn_ledger_e2e")]

DEEP = 100_000
POISON_FLOOD = 16  # four times CAIRN_MAX_IN_FLIGHT (4 in the stack)
REPLY_WITHIN_S = 5.0  # the responders answer a malformed request at once; this bounds "at once" generously
SETTLE_S = WAIT_S * 2


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    with running_stack(tmp_path_factory.mktemp("cairn-ledger"), redis_url, s3_endpoint) as s:
        yield s


def failures(stack: CairnStack) -> list[Any]:
    return [r for r in stack.core.ingested if r.kind == "failure"]


def settled(stack: CairnStack, kind: str) -> bool:
    consumer = stack.consumer(kind)
    return consumer["num_ack_pending"] == 0 and consumer["num_pending"] == 0


def result_ids(stack: CairnStack, job_id: str) -> set[str]:
    """Distinct result msg-ids core stored for the job: more than one is a second execution."""
    return {r.msg_id for r in stack.results_for(job_id) if r.kind != "failure"}


def detail_calls(stack: CairnStack, ext_id: str) -> int:
    return len([r for r in stack.strava.requests if r.path.endswith(f"/activities/{ext_id}")])


def new_bridge(stack: CairnStack, name: str) -> Proc:
    """A fresh bridge instance of the pool (the previous one is dead or gone)."""
    stack.bridge = bridge = stack.spawn_bridge(name)
    wait_until(lambda: "cairn bridge started" in bridge.log() or bridge.proc.poll() is not None,
               WAIT_S, "the new bridge to start")
    assert bridge.proc.poll() is None, bridge.log()[-3000:]
    return bridge


def sigkill(proc: Proc) -> None:
    if proc.proc.poll() is None:
        os.killpg(proc.proc.pid, signal.SIGKILL)
    proc.proc.wait(WAIT_S)


def live_bridge(stack: CairnStack) -> None:
    """A running, responsive bridge (an earlier test may have left a killed or stopped one)."""
    stack.gate.open()
    if stack.bridge is not None and stack.bridge.proc.poll() is None:
        return
    new_bridge(stack, f"bridge-{uuid.uuid4().hex[:4]}")


def succeeded_jobs(stack: CairnStack) -> int:
    """``cairn.job`` tasks the workers report finished (Celery's own log line)."""
    return sum(len(re.findall(r"Task cairn\.job\[[^\]]+\] succeeded", w.log())) for w in stack.workers)


def request_raw(stack: CairnStack, subject: str, body: bytes) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        nc = await nats.connect(stack.nats.url)
        try:
            reply = await nc.request(subject, body, timeout=REPLY_WITHIN_S)
            return json.loads(reply.data)
        finally:
            await nc.close()
    return asyncio.run(run())


# --------------------------------------------------------------------------- observed defect 1
def test_deep_json_and_a_bad_parser_version_are_termed_with_an_envelope_not_looped(stack: CairnStack) -> None:
    acct = stack.connect_athlete()
    seen = len(failures(stack))
    stack.publish_raw("fetch_source", b"[" * DEEP + b"]" * DEEP)
    activities = sorted(stack.strava.athlete(int(acct.external_id)).activities)
    for version, ext_id in zip(("one.two", "1.x"), activities, strict=False):  # one ext_id each: own msg-ids
        job = stack.fetch_job(acct, str(ext_id))
        job |= {"blob": {"url": "http://127.0.0.1:1/never", "fallback_handle": "users/x/strava/raw.json"},
                "min_parser_version": version}
        stack.core.enqueue_job("parse_blob", job)
    stack.core.router.wait(lambda: len(failures(stack)) >= seen + 3, SETTLE_S, "three failure envelopes")
    envelopes = failures(stack)[seen:]
    assert [e.data["error"]["code"] for e in envelopes] == ["bad_payload"] * 3
    assert sum("min_parser_version" in e.data["error"]["message"] for e in envelopes) == 2
    wait_until(lambda: settled(stack, "fetch_source") and settled(stack, "parse_blob"), WAIT_S, "the terms")
    assert stack.bridge is not None
    assert "bridge error" not in stack.bridge.log()


def test_sixteen_poison_messages_do_not_wedge_the_pool(stack: CairnStack) -> None:
    acct = stack.connect_athlete()
    seen = len(failures(stack))
    for _ in range(POISON_FLOOD):
        stack.publish_raw("fetch_source", b'{"job_id": ' + b"[" * DEEP + b"]" * DEEP + b"}")
    job = stack.fetch_job(acct, stack.first_activity_id(acct))
    stack.core.enqueue_job("fetch_source", job)
    stack.core.router.wait(lambda: bool(result_ids(stack, job["job_id"])), SETTLE_S, "the good job's result")
    stack.core.router.wait(lambda: len(failures(stack)) >= seen + POISON_FLOOD, SETTLE_S, "every envelope")
    assert len(failures(stack)) == seen + POISON_FLOOD  # one envelope each, none twice
    wait_until(lambda: settled(stack, "fetch_source"), WAIT_S, "every poison message termed")


MALFORMED = [b"[" * DEEP + b"]" * DEEP, b"\xff\xfe\x00", b"[1, 2]", b'"text"', b"{", b'{"a": NaN}']


@pytest.mark.parametrize("body", [*MALFORMED, b'{"account_id": "a", "start_page": 1e400}',
                                  b'{"account_id": 7}', b'{"account_id": "a", "start_page": "two"}'])
def test_discover_answers_bad_request(stack: CairnStack, body: bytes) -> None:
    reply = request_raw(stack, subjects.discover_subject(PROVIDER, stack.pool), body)
    assert reply.get("error") == "bad_request", reply
    assert "items" not in reply and "complete" not in reply  # never an empty success


@pytest.mark.parametrize("body", [*MALFORMED, b'{"client_id": 1, "client_secret": "s", "code": "c"}',
                                  b'{"client_id": "i", "client_secret": "s"}'])
def test_oauth_exchange_answers_bad_request(stack: CairnStack, body: bytes) -> None:
    reply = request_raw(stack, subjects.oauth_exchange_subject(PROVIDER, stack.pool), body)
    assert reply.get("error") == "bad_request" and reply.get("message"), reply
    assert "access_token" not in reply


# --------------------------------------------------------------------------- observed defect 2
def test_a_bridge_killed_between_result_and_ack_is_settled_from_the_ledger(stack: CairnStack) -> None:
    live_bridge(stack)
    acct = stack.connect_athlete()
    ext_id = stack.first_activity_id(acct)
    job = stack.fetch_job(acct, ext_id)
    r = redis.Redis.from_url(stack.redis_url)
    doomed = stack.bridge
    assert doomed is not None
    finished = succeeded_jobs(stack)
    stack.hold_at_the_gate(job)
    freeze(doomed.proc.pid)  # the bridge hears nothing from here on...
    try:
        stack.gate.open()
        stack.core.router.wait(lambda: bool(result_ids(stack, job["job_id"])), WAIT_S, "the task's result")
        wait_until(lambda: succeeded_jobs(stack) > finished, WAIT_S, "the task's end")
    finally:
        sigkill(doomed)  # ...and dies without acking
    bridge = new_bridge(stack, f"bridge-after-kill-{uuid.uuid4().hex[:4]}")
    wait_until(lambda: settled(stack, "fetch_source"), SETTLE_S, "the redelivery's settling")
    assert result_ids(stack, job["job_id"]) == {f"result:{job['job_id']}:d1"}  # published once
    assert detail_calls(stack, ext_id) == 1  # Strava's budget spent once
    assert "applying the recorded outcome, not running it again" in bridge.log()
    wait_until(lambda: not list(r.scan_iter(f"{OUTCOME_PREFIX}*")), WAIT_S, "the ledger entry's delete")


def test_a_task_still_running_when_its_bridge_died_is_adopted_not_run_again(stack: CairnStack) -> None:
    live_bridge(stack)
    acct = stack.connect_athlete()
    ext_id = stack.first_activity_id(acct)
    job = stack.fetch_job(acct, ext_id)
    stack.hold_at_the_gate(job)
    assert stack.bridge is not None
    sigkill(stack.bridge)
    bridge = new_bridge(stack, f"bridge-adopting-{uuid.uuid4().hex[:4]}")
    wait_until(lambda: "adopted the running task" in bridge.log(), SETTLE_S, "the redelivery's adoption")
    stack.gate.open()  # the orphaned task finishes only now
    stack.core.router.wait(lambda: bool(result_ids(stack, job["job_id"])), WAIT_S, "the adopted task's result")
    wait_until(lambda: settled(stack, "fetch_source"), SETTLE_S, "the adopting bridge's ack")
    assert result_ids(stack, job["job_id"]) == {f"result:{job['job_id']}:d1"}
    assert detail_calls(stack, ext_id) == 1
    assert "the adopted task's outcome is ack" in bridge.log()
