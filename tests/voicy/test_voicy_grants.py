"""Two-phase grants (V1, V2): a process killed between granting a job and sending its task.

Each site that grants a lease — the bridge's claim, the download's hand-over to
the transcription, the reaper's redispatch — does so with a *pending* TTL of one
lease TTL, sends the task, and only then confirms the grant to the long queued
TTL. A crash between the grant and the send is simulated exactly: the test runs
the real grant step (the bridge's own ``cycle`` with a dispatcher that never
sends, ``pipeline.run_download`` or ``pipeline.reap`` called directly) and does
not send. The pending grant must expire within about a lease TTL, the beat reaper
must recover the job, and the job must complete exactly once on the dev Voicy
server. A kill just *after* the send but before the confirmation leaves that task
in the broker with a grant that expires if it waits too long; delivered late (the
test sends it once the job was recovered), it must find its grant gone and do
nothing (V2). With the old 6-hour grant the job would stay stuck for the whole test.

The last test drives the real dispatch path (bridge and io task) and reads the
sent messages off the broker: grants are confirmed after the send, and the
``argsrepr`` header that Flower and task events show hides the lease token.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis

from devstack.infra.stack import ROOT, start_beat, start_bridge
from tests.kit.celery_worker import CeleryWorker
from tests.kit.shared_fleet import SharedVoicyFleet, shared_voicy_fleet
from tests.kit.voicy_stack import (
    RECOVERY_LEASE_TTL_MS,
    assert_completed_once,
    claim_without_sending,
    enqueue_fixture,
    fleet_runtime,
    queued_tasks,
    requests_for,
    short_item,
    voicy_dev_stack,
    wait_final,
)
from tests.kit.waiting import wait_until
from workers.voicy import pipeline
from workers.voicy.runtime import QUEUED_LEASE_TTL_S, VoicyRuntime

pytestmark = pytest.mark.slow

LEASE_TTL_MS = RECOVERY_LEASE_TTL_MS  # a pending grant lives this long
# The reaper runs every min(5 s, TTL / 2); a loaded 2-core box adds seconds of task latency. Anything
# of this order proves the grant was pending: a confirmed one lasts QUEUED_LEASE_TTL_S (6 h).
RECOVERY_BOUND_S = LEASE_TTL_MS / 1000 + 30.0
STALE_TASK_TIMEOUT_S = 60.0
JOB_SEND_TIMEOUT_S = 60.0
STALE_SKIP = "{stage} already owned by another execution; skipping"


@pytest.fixture()
def voicy(tmp_path: Path, fresh_redis: str) -> Iterator[tuple[Any, Any, dict[str, str]]]:
    """A dev Voicy API, a fake Telegram, and the fleet environment (the recovery lease TTL)."""
    with voicy_dev_stack(tmp_path, fresh_redis, "grants", VOICY_WORKER_LEASE_TTL_MS=str(LEASE_TTL_MS)) as stack:
        yield stack


@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedVoicyFleet]:
    """The io and gpu workers (the recovery lease TTL) of the tests where this process plays the killed
    bridge, io task or reaper (tests/kit/shared_fleet.py): started once, not once per test. No bridge:
    a test that needs one starts it, and beat is each test's own (one test starts it late)."""
    with shared_voicy_fleet(tmp_path_factory.mktemp("grants-fleet"), "grants", members=("io", "gpu"),
                            VOICY_WORKER_LEASE_TTL_MS=str(LEASE_TTL_MS)) as fleet:
        yield fleet


@pytest.fixture()
def shared(shared_fleet: SharedVoicyFleet, tmp_path: Path) -> Iterator[SharedVoicyFleet]:
    """The shared workers for one test; what they log meanwhile is copied into its ``tmp_path``."""
    with shared_fleet.attributed(tmp_path) as fleet:
        yield fleet


@pytest.fixture()
def rt(shared: SharedVoicyFleet, monkeypatch: pytest.MonkeyPatch) -> Iterator[VoicyRuntime]:
    """This test process as one more fleet process: same Redis, Voicy server, media store."""
    with fleet_runtime(shared.env, monkeypatch) as runtime:
        yield runtime


def assert_pending(rt: VoicyRuntime, job_id: str, token: str) -> None:
    """The grant names ``token`` and lives at most one lease TTL (it was never confirmed)."""
    assert rt.leases.holder(job_id) == f"granted:{token}"
    assert 0 < rt.redis.pttl(rt.leases.key(job_id)) <= LEASE_TTL_MS


def send_stale(env: dict[str, str], task: str, job_id: str, token: str) -> None:
    """Deliver the task for ``token`` late, through the real broker (sent before a kill, never confirmed)."""
    code = ("import sys, tasks.voicy as v; "
            "getattr(v, sys.argv[1]).apply_async(args=[sys.argv[2], sys.argv[3]])")
    subprocess.run([sys.executable, "-c", code, task, job_id, token], cwd=ROOT, env=env,
                   check=True, timeout=STALE_TASK_TIMEOUT_S, capture_output=True)


def holds_one(r: redis.Redis, queue: str) -> bool:
    return r.llen(queue) == 1


def wait_stale_skipped(logs: Callable[[], str], job_id: str, stage: str) -> None:
    line = f"job {job_id}: " + STALE_SKIP.format(stage=stage)
    wait_until(lambda: line in logs(), STALE_TASK_TIMEOUT_S, f"the stale {stage} task to skip")


# ------------------------------------------------------------------ site 1: the bridge's claim
def test_bridge_killed_before_sending_the_download_job_is_requeued_and_completes_once(
        shared: SharedVoicyFleet, rt: VoicyRuntime, tmp_path: Path) -> None:
    server, telegram, env = shared.server, shared.telegram, shared.env
    job_id_expected = enqueue_fixture(server, telegram, short_item())
    beat = start_beat(env, tmp_path, tmp_path / "beat.log")
    bridge = None
    try:
        job_id, token = claim_without_sending(rt)
        granted_at = time.monotonic()
        assert job_id == job_id_expected
        assert_pending(rt, job_id, token)
        # no media was stored: the reaper reports a retryable failure so Voicy requeues the job
        # answered, not only received: the dev Voicy API records a request with status 0 until it has replied
        wait_until(lambda: [q for q in requests_for(server, job_id, "failure") if q["status"]], RECOVERY_BOUND_S,
                   "the reaper to hand the job back")
        assert time.monotonic() - granted_at < RECOVERY_BOUND_S
        (failure,) = requests_for(server, job_id, "failure")
        assert failure["json"]["retryable"] is True and failure["status"] == 200
        send_stale(env, "download", job_id, token)
        wait_stale_skipped(shared.text, job_id, "download")
        assert not requests_for(server, job_id, "source")  # the late task touched nothing
        bridge = start_bridge(env, tmp_path / "bridge.log")  # claims the requeued job again
        wait_final(server, [job_id])
    finally:
        if bridge is not None:
            bridge.stop()
        beat.stop()
    assert_completed_once(server, job_id)
    assert server.get_job(job_id)["attempts"] == 2
    assert len(requests_for(server, job_id, "failure")) == 1


# ------------------------------------------------- site 2: the download's hand-over to transcription
def test_io_worker_killed_after_the_hand_over_the_reaper_redispatches_and_it_completes_once(
        shared: SharedVoicyFleet, rt: VoicyRuntime, tmp_path: Path) -> None:
    server, telegram, env = shared.server, shared.telegram, shared.env
    enqueue_fixture(server, telegram, short_item())
    beat = start_beat(env, tmp_path, tmp_path / "beat.log")
    try:
        job_id, token = claim_without_sending(rt)
        next_token = pipeline.run_download(rt, job_id, token)  # the io task's body, then no send
        handed_over_at = time.monotonic()
        assert next_token
        assert_pending(rt, job_id, next_token)
        assert server.get_job(job_id)["status"] == "ready"
        wait_until(lambda: requests_for(server, job_id, "transcribe"), RECOVERY_BOUND_S,
                   "the reaper to redispatch the transcription")
        assert time.monotonic() - handed_over_at < RECOVERY_BOUND_S
        wait_final(server, [job_id])
        send_stale(env, "transcribe", job_id, next_token)
        wait_stale_skipped(shared.text, job_id, "transcription")
    finally:
        beat.stop()
    assert_completed_once(server, job_id)
    assert len(requests_for(server, job_id, "transcribe")) == 1
    assert not requests_for(server, job_id, "failure")
    assert re.search(rf"job {job_id}: .*redispatching transcription", shared.text())


# ------------------------------------------------------------ site 3: the reaper's redispatch
def test_reaper_killed_before_sending_the_redispatch_the_next_pass_recovers_it_once(
        shared: SharedVoicyFleet, rt: VoicyRuntime, tmp_path: Path) -> None:
    server, telegram, env = shared.server, shared.telegram, shared.env
    enqueue_fixture(server, telegram, short_item())
    job_id, token = claim_without_sending(rt)
    next_token = pipeline.run_download(rt, job_id, token)
    assert next_token
    # no beat yet, so this test process is the only reaper: wait for the hand-over to expire
    wait_until(lambda: not rt.leases.alive(job_id), RECOVERY_BOUND_S, "the unsent hand-over to expire")
    (recovery,) = pipeline.reap(rt)  # grants the redispatch, then "dies" before sending it
    reaped_at = time.monotonic()
    assert recovery.job_id == job_id
    assert_pending(rt, job_id, recovery.token)
    wait_until(lambda: not rt.leases.alive(job_id), RECOVERY_BOUND_S, "the reaper's unsent grant to expire")
    assert time.monotonic() - reaped_at < RECOVERY_BOUND_S
    beat = start_beat(env, tmp_path, tmp_path / "beat.log")  # the next reaper pass
    try:
        wait_final(server, [job_id])
        send_stale(env, "transcribe", job_id, recovery.token)
        wait_stale_skipped(shared.text, job_id, "transcription")
    finally:
        beat.stop()
    assert_completed_once(server, job_id)
    assert len(requests_for(server, job_id, "transcribe")) == 1
    assert not requests_for(server, job_id, "failure")


# ------------------------------------------- the real dispatch path: confirmed grants, hidden tokens
def test_sent_tasks_hide_the_token_from_flower_and_their_grants_are_confirmed(
        voicy: tuple[Any, Any, dict[str, str]], celery_workers: Callable[..., CeleryWorker], tmp_path: Path,
        fresh_redis: str) -> None:
    server, telegram, env = voicy
    job_id = enqueue_fixture(server, telegram, short_item())
    r = redis.Redis.from_url(fresh_redis)
    lease_key = f"sy:lease:voicy:{job_id}"
    bridge = start_bridge(env, tmp_path / "bridge.log")
    try:
        for queue, task, starts in (("io", "voicy.download", None), ("gpu", "voicy.transcribe", "io")):
            if starts:
                celery_workers(starts, env)  # runs the download, which sends the transcription
            wait_until(partial(holds_one, r, queue), JOB_SEND_TIMEOUT_S, f"the {task} message")
            queued = queued_tasks(r, queue)[0]
            argsrepr, args, name = queued.argsrepr, queued.args, queued.task
            assert name == task and args[0] == job_id
            token = args[1]
            assert argsrepr == repr((job_id, "…")) and token not in argsrepr
            # confirmed after the send: the grant now outlives any pending TTL by far
            wait_until(lambda: r.pttl(lease_key) > LEASE_TTL_MS, JOB_SEND_TIMEOUT_S, "the grant to be confirmed")
            assert r.get(lease_key) == f"granted:{token}".encode()
            assert r.pttl(lease_key) > (QUEUED_LEASE_TTL_S - JOB_SEND_TIMEOUT_S) * 1000
        celery_workers("gpu", env)
        wait_final(server, [job_id])
    finally:
        bridge.stop()
    assert_completed_once(server, job_id)

