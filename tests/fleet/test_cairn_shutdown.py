"""Graceful shutdown of the Cairn side: a bridge or the garmin worker SIGTERMed mid-job, each job ingested once.

The dyno manager's stop (``tests/kit/dyno_stop.py``) goes to the whole process
group; the garmin worker runs as its Procfile line (``REMAP_SIGTERM=SIGQUIT``,
``-P threads``). Only the external systems are fakes (dev Cairn core, fake
Strava, fake Garmin), and a gate in front of the provider holds a fetch for as
long as a test needs, so "mid-job" is a state the test waits for.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from devstack.infra import procfile
from devstack.infra.log_budget import Allow
from devstack.infra.procs import Proc
from tasks.hardening.transport import queue_keys
from tasks.routes import provider_queue
from tests.kit.cairn_stack import WAIT_S, CairnStack, started_stack
from tests.kit.dyno_stop import HEROKU_KILL_AFTER_S, QUICK_DRAIN_LIMIT_S, WORKER_EXIT_GRACE_S
from tests.kit.garmin_stack import GarminStack
from tests.kit.waiting import wait_until

# H1: no process's stop logs a WARNING that no allow-list entry explains (tests/conftest.py ``log_budget``).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("log_budget")]

LOG_BUDGET_ALLOW = [
    Allow(r"Cold shutdown: a task still running in a thread cannot be killed",
          reason="the test stops the garmin worker with no soft window while Garmin holds its fetch",
          provoked_by="test_sigterm_garmin_past_the_soft_window_leaves_the_fetch_to_end_and_exits_cleanly"),
]


# --------------------------------------------------------------------------- Cairn bridge
@pytest.fixture()
def cairn(tmp_path: Path, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    with started_stack(tmp_path, redis_url, s3_endpoint) as stack:
        yield stack


def _queued_cairn_tasks(r: redis.Redis, pool: str) -> list[str]:
    """Task ids (``cairn-<pool>-<seq>-d<delivery>-…``) of the ``cairn.job`` messages waiting in the pool's queue."""
    ids = []
    for raw in r.lrange(provider_queue(pool), 0, -1):
        headers = json.loads(raw).get("headers", {})
        if headers.get("task") == "cairn.job":
            ids.append(headers["id"])
    return ids


def _seq_of(task_id: str) -> tuple[int, int]:
    _, seq, delivery, _ = task_id.rsplit("-", 3)  # cairn-<pool>-<seq>-d<delivery>-<hex>
    return int(seq), int(delivery.lstrip("d"))


def test_sigterm_cairn_bridge_naks_queued_messages_finishes_running_ones_ingests_once(cairn: CairnStack) -> None:
    """Queued messages are NAKed at once and taken by a second instance while the first still
    finishes its running job; every job is ingested exactly once."""
    from workers.cairn.settings import DEFAULT_SHUTDOWN_GRACE_S as SHUTDOWN_GRACE_S

    stack = cairn
    r = redis.Redis.from_url(stack.redis_url)
    stack.start_worker(concurrency=1)  # one running task; the rest wait in the Celery queue
    acct = stack.connect_athlete(n_activities=3)
    ath = stack.strava.athlete(int(acct.external_id))
    jobs = [stack.fetch_job(acct, str(ext_id)) for ext_id in sorted(ath.activities)[:3]]
    bridge_a = stack.start_bridge()
    bridge_b = None
    try:
        stack.gate.arm()
        for job in jobs:
            stack.core.enqueue_job("fetch_source", job)
        assert stack.gate.arrived.wait(60), "no job reached Strava"
        wait_until(lambda: len(_queued_cairn_tasks(r, stack.pool)) == 2, 30, "two tasks queued behind the running one")
        first_seqs = {_seq_of(t)[0] for t in _queued_cairn_tasks(r, stack.pool)}

        t0 = time.monotonic()
        os.killpg(bridge_a.proc.pid, signal.SIGTERM)
        bridge_b = stack.spawn_bridge("bridge-b")

        def redelivered() -> bool:
            later = {_seq_of(t)[0] for t in _queued_cairn_tasks(r, stack.pool) if _seq_of(t)[1] >= 2}
            return first_seqs <= later
        wait_until(redelivered, 20, "the queued jobs redelivered to the second bridge")
        assert bridge_a.proc.poll() is None, "the first bridge must still be finishing its running job"
        assert time.monotonic() - t0 < SHUTDOWN_GRACE_S

        stack.gate.open()
        rc = bridge_a.proc.wait(SHUTDOWN_GRACE_S + 5)
        exited_s = time.monotonic() - t0
        for job in jobs:
            stack.core.router.wait(partial(stack.has_result, job["job_id"]), 60, "every job's result")
        wait_until(lambda: stack.consumer("fetch_source")["num_ack_pending"] == 0, 30, "every message settled")
    finally:
        stack.gate.open()
        if bridge_b is not None:
            bridge_b.stop()
    log_a = bridge_a.log()
    assert rc == 0 and exited_s < HEROKU_KILL_AFTER_S, (rc, exited_s, log_a[-3000:])
    assert log_a.count("shutting down; revoked the queued task") >= 2, log_a[-3000:]
    msg_ids = {job["job_id"]: [res.msg_id for res in stack.results_for(job["job_id"])] for job in jobs}
    assert all(len(ids) == 1 for ids in msg_ids.values()), msg_ids
    finished_by_a = [j for j, ids in msg_ids.items() if ids[0].endswith(":d1")]
    assert len(finished_by_a) == 1, msg_ids  # the running one; the two queued ones were redelivered
    assert stack.consumer("fetch_source")["num_pending"] == 0
    worker_log = "\n".join(w.log() for w in stack.workers)
    skipped = set(re.findall(r"cairn\.job\[(cairn-[\w-]+?-\d+-d\d+-[0-9a-f]+)\] succeeded[^\n]*lease not granted",
                             worker_log))
    assert {_seq_of(t) for t in skipped} == {(seq, 1) for seq in first_seqs}  # revoked copies did nothing


def _cairn_leases(r: redis.Redis) -> dict[str, str]:
    # bytes: a client without decode_responses
    return {k.decode(): (cast("bytes | None", r.get(k)) or b"").decode() for k in r.scan_iter("sy:lease:cairn:*")}


def test_cairn_job_running_past_the_shutdown_grace_is_still_ingested_once(cairn: CairnStack) -> None:
    """A provider call slower than the bridge's shutdown grace: the message is NAKed to another
    instance while its first task still runs. Exactly one result may reach core."""
    from workers.cairn.settings import DEFAULT_SHUTDOWN_GRACE_S as SHUTDOWN_GRACE_S

    stack = cairn
    r = redis.Redis.from_url(stack.redis_url)
    stack.start_worker(concurrency=2)  # room for the redelivered copy beside the slow one
    acct = stack.connect_athlete(n_activities=1)
    job = stack.fetch_job(acct, stack.first_activity_id(acct))
    bridge_a = stack.start_bridge()
    bridge_b = None
    try:
        stack.gate.arm()
        stack.core.enqueue_job("fetch_source", job)
        assert stack.gate.arrived.wait(60), "the job never reached Strava"
        running = wait_until(lambda: [(k, v) for k, v in _cairn_leases(r).items() if v.startswith("running:")],
                             10, "the running lease")
        ((key, first_holder),) = running
        t0 = time.monotonic()
        os.killpg(bridge_a.proc.pid, signal.SIGTERM)
        bridge_b = stack.spawn_bridge("bridge-b")
        rc = bridge_a.proc.wait(SHUTDOWN_GRACE_S + 10)
        exited_s = time.monotonic() - t0
        assert rc == 0 and exited_s < HEROKU_KILL_AFTER_S, (rc, exited_s)
        # the second instance got the message: it adopts the running task (C4) or, had that task
        # gone, starts its own copy; give either the chance to happen before Strava answers
        wait_until(lambda: _cairn_leases(r).get(key, first_holder) != first_holder
                   or "adopted the running task" in bridge_b.log(), 15,
                   "the redelivered message to be handled by the second bridge")
        stack.gate.open()
        stack.core.router.wait(lambda: bool(stack.results_for(job["job_id"])), 30, "a result")
        wait_until(lambda: stack.consumer("fetch_source")["num_ack_pending"] == 0, 30, "the message settled")
        worker_log = lambda: "\n".join(w.log() for w in stack.workers)  # noqa: E731
        first_done = r"cairn\.job\[(cairn-[\w-]+?-\d+-d1-[0-9a-f]+)\] succeeded"
        wait_until(lambda: len(set(re.findall(first_done, worker_log()))),
                   30, "the first, slow task to end")
    finally:
        stack.gate.open()
        if bridge_b is not None:
            bridge_b.stop()
    msg_ids = [res.msg_id for res in stack.results_for(job["job_id"])]
    assert len(msg_ids) == 1, msg_ids


# --------------------------------------------------------------------------- garmin worker (threads)
GARMIN_POOL = "garmin-fetcher"  # the pool the Procfile's garmin line serves


@pytest.fixture()
def garmin(tmp_path: Path, redis_url: str, s3_endpoint: str) -> Iterator[GarminStack]:
    stack = GarminStack(tmp_path, redis_url, s3_endpoint, pool=GARMIN_POOL)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def garmin_worker(env: dict[str, str], name: str, log_path: Path) -> Proc:
    """The Procfile's garmin line, once Celery says it is ready (stopped if it never is)."""
    worker = procfile.run("garmin", {**env, "HONCHO_PROCESS_NAME": name}, log_path)
    try:
        wait_until(lambda: " ready." in worker.log() or worker.proc.poll() is not None, WAIT_S, "the garmin worker")
    except BaseException:
        worker.stop()
        raise
    return worker


def held_fetch(stack: GarminStack) -> dict[str, Any]:
    """A fetch_source job for one activity, sent and held at Garmin by the stack's gate."""
    connected, account = stack.connect_garmin(n_activities=1)
    job = stack.fetch_job(connected.account, str(account.newest_first()[0].activity_id))
    stack.gate.arm()
    stack.core.enqueue_job("fetch_source", job)
    assert stack.gate.arrived.wait(WAIT_S), "the job never reached Garmin"
    return job


def test_sigterm_garmin_mid_fetch_finishes_the_job_and_exits_as_it_ends(garmin: GarminStack, tmp_path: Path) -> None:
    """The Procfile's garmin line runs its jobs on threads (``-P threads``): the soft window lets the
    running fetch finish and ends as soon as it has, as a prefork worker's does
    (tasks/hardening/quick_drain.py); the job is ingested once and its message settled."""
    stack = garmin
    stack.start_bridge()
    worker = garmin_worker(stack.env, "garmin.1", tmp_path / "worker-garmin.log")
    try:
        job = held_fetch(stack)
        signalled = time.monotonic()
        os.killpg(worker.proc.pid, signal.SIGTERM)
        wait_until(lambda: "Soft shutdown: waiting" in worker.log(), 10, "the soft shutdown")
        stack.gate.open()
        stack.core.router.wait(lambda: bool(stack.results_for(job["job_id"])), WAIT_S, "the job's result")
        job_ended = time.monotonic()  # the result is at core: the task's last lines run now
        rc = worker.proc.wait(WORKER_EXIT_GRACE_S)
        exited = time.monotonic()
        wait_until(lambda: stack.consumer("fetch_source")["num_ack_pending"] == 0, WAIT_S, "the message settled")
    finally:
        stack.gate.open()
        worker.stop()
    log = worker.log()
    assert "Soft shutdown: work in hand ended" in log, log[-3000:]
    assert exited - job_ended < QUICK_DRAIN_LIMIT_S, (exited - job_ended, exited - signalled, log[-3000:])
    assert rc == 0, log[-3000:]
    assert len(stack.results_for(job["job_id"])) == 1


def test_sigterm_garmin_past_the_soft_window_leaves_the_fetch_to_end_and_exits_cleanly(
        garmin: GarminStack, tmp_path: Path) -> None:
    """Past the soft window Celery cancels the tasks still running, which a threads pool cannot do: the
    worker ended with ``Unrecoverable error: NotImplementedError(... does not implement kill_job)`` and
    exit 1 (a full run). The fetch now runs to its end, the worker exits 0 after it, and a second worker
    given the message back produces no second result. A window of 0 s is the Procfile's 10 s passed."""
    stack = garmin
    stack.start_bridge()
    env = {**stack.env, "WORKER_SOFT_SHUTDOWN_TIMEOUT_S": "0"}
    worker = garmin_worker(env, "garmin.1", tmp_path / "worker-garmin.log")
    second = None
    try:
        job = held_fetch(stack)
        os.killpg(worker.proc.pid, signal.SIGTERM)
        wait_until(lambda: "cannot be killed" in worker.log() or worker.proc.poll() is not None, WAIT_S,
                   "the cancel of the running fetch")
        stack.gate.open()
        rc = worker.proc.wait(WORKER_EXIT_GRACE_S)
        stack.core.router.wait(lambda: bool(stack.results_for(job["job_id"])), WAIT_S, "the job's result")
        second = garmin_worker(env, "garmin.2", tmp_path / "worker-garmin-2.log")
        queue = redis.Redis.from_url(stack.redis_url)
        try:  # a copy given back is taken by the second worker, and ends there
            wait_until(lambda: not any(queue.llen(key) for key in queue_keys(provider_queue(GARMIN_POOL))),
                       WAIT_S, "the queue to be empty")
        finally:
            queue.close()
        wait_until(lambda: second.log().count("] received") == second.log().count("] succeeded"), WAIT_S,
                   "the second worker's tasks to end")
        wait_until(lambda: stack.consumer("fetch_source")["num_ack_pending"] == 0, WAIT_S, "the message settled")
    finally:
        stack.gate.open()
        worker.stop()
        if second is not None:
            second.stop()
    log = worker.log()
    assert rc == 0, log[-3000:]
    assert "Traceback" not in log and "CRITICAL" not in log, log[-3000:]
    assert len(stack.results_for(job["job_id"])) == 1
