"""Recovery paths that must still end every claimed job exactly one way (V1), media included.

* ``/downloaded`` never lands — the io process is SIGKILLed while the call is in
  flight (a gate drops it on the wire), or Voicy stays down past the client's
  retry budget so the ``/failure`` post fails too. The media is in the store and
  the job still ``downloading`` at Voicy, which reaps no downloading job
  (reference §3.2): the reaper's transcription must complete the handshake, and
  the job must be transcribed exactly once.
* Voicy fails a held job under us (an unreachable chat, reference §3.5): the
  heartbeat gets a stale 404, and the media must still be deleted once the
  job's task is done.
* The bridge cannot record a claim (a Redis error, before or after the write
  went through): the backlog slot must not leak and the job must go back to
  Voicy as a retryable failure, then be claimed again.
* Beat's ``voicy.heartbeat``: one ``POST /heartbeat`` per held job with a live
  lease, none for a job whose lease expired.

Real Redis, the dev Voicy API and fake Telegram on loopback, real Celery
workers, beat and bridge where a test needs them; this process runs the same
pipeline and beat task code where a test must control each step.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from bridges.voicy import VoicyBridge
from devstack.infra import services
from devstack.infra.stack import start_beat, start_bridge
from tests.kit.celery_worker import CeleryWorker
from tests.kit.gate import Gate
from tests.kit.voicy_stack import (
    JOB_DONE_TIMEOUT_S,
    RECOVERY_LEASE_TTL_MS,
    assert_completed_once,
    claim_without_sending,
    enqueue_fixture,
    fleet_runtime,
    gated_voicy_dev_stack,
    never_sent,
    requests_for,
    short_item,
    wait_final,
    worker_logs,
)
from tests.kit.waiting import wait_until
from workers.errors import RetryableJobError
from workers.voicy import pipeline, transcription
from workers.voicy.client import RETRY_ATTEMPTS
from workers.voicy.fleet import Fleet
from workers.voicy.runtime import VoicyRuntime

pytestmark = pytest.mark.slow

LEASE_TTL_MS = RECOVERY_LEASE_TTL_MS  # a dead task's running lease expires this long after it died
DOWNLOAD_REACHED_TIMEOUT_S = 60.0
LEASE_EXPIRY_TIMEOUT_S = LEASE_TTL_MS / 1000 + 10.0
CLEANUP_TIMEOUT_S = 30.0
SERVER_CLOCK_SKIP_S = 60.0  # moves Voicy's clock so a fresh heartbeatAt is told apart from the claim's
HANDSHAKE_LOG = "Voicy never recorded /downloaded; completing the handshake"
GatedVoicy = tuple[Any, Any, Gate, dict[str, str]]  # dev Voicy API, fake Telegram, the gate, the fleet environment
# the same with the Redis of its own and this process as a fleet member on it in place of the environment
OwnRedisStack = tuple[Any, Any, Gate, tuple[services.Service, VoicyRuntime]]


@pytest.fixture()
def voicy(tmp_path: Path, fresh_redis: str,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[GatedVoicy]:
    """Dev Voicy API behind a gate on ``/downloaded``, fake Telegram, and the fleet environment."""
    gate = Gate.path_suffix("/downloaded", once=True)
    with gated_voicy_dev_stack(gate, monkeypatch, tmp_path, fresh_redis, "recovery",
                               VOICY_WORKER_LEASE_TTL_MS=str(LEASE_TTL_MS)) as (server, telegram, env):
        yield server, telegram, gate, env


@pytest.fixture()
def rt(voicy: GatedVoicy, monkeypatch: pytest.MonkeyPatch) -> Iterator[VoicyRuntime]:
    """This test process as one more fleet process: same Redis, Voicy server, media store."""
    with fleet_runtime(voicy[3], monkeypatch) as runtime:
        yield runtime


def stored_media(tmp_path: Path) -> list[Path]:
    """Every file in the local media store (the work directory), partial uploads included."""
    work = tmp_path / "work"
    return sorted(p for p in work.rglob("*") if p.is_file()) if work.exists() else []


def wait_fleet_clean(redis_url: str, tmp_path: Path) -> None:
    """The job's last task ends with ``finish``: no held record and no media may remain."""
    fleet = Fleet(redis.Redis.from_url(redis_url))
    wait_until(lambda: not fleet.held_ids() and not stored_media(tmp_path), CLEANUP_TIMEOUT_S,
               "the fleet to forget the job and delete its media")


def statuses(server: Any, job_id: str, endpoint: str) -> list[int]:
    return [r["status"] for r in requests_for(server, job_id, endpoint)]


# ------------------------------------------------------------- 1. /downloaded never lands
def test_io_killed_while_downloaded_is_in_flight_the_job_still_completes_once(
        voicy: GatedVoicy, celery_workers: Callable[..., CeleryWorker], tmp_path: Path, fresh_redis: str) -> None:
    server, telegram, gate, env = voicy
    job_id = enqueue_fixture(server, telegram, short_item())
    gate.arm()
    io = celery_workers("io", env)
    celery_workers("gpu", env)
    beat = start_beat(env, tmp_path, tmp_path / "beat.log")
    bridge = start_bridge(env, tmp_path / "bridge.log")
    try:
        assert gate.arrived.wait(DOWNLOAD_REACHED_TIMEOUT_S), "the download never reached /downloaded"
        io.kill(signal.SIGKILL)
        gate.drop()  # the call dies on the wire with its caller: Voicy never sees it
        assert server.get_job(job_id)["status"] == "downloading"
        assert len(stored_media(tmp_path)) == 1  # the media was stored before the call
        celery_workers("io", env)  # the replacement host; it also runs beat's reaper
        wait_final(server, [job_id], JOB_DONE_TIMEOUT_S)
        wait_fleet_clean(fresh_redis, tmp_path)
    finally:
        bridge.stop()
        beat.stop()
    assert_completed_once(server, job_id)
    assert statuses(server, job_id, "downloaded") == [200]  # only the recovery's call landed
    assert statuses(server, job_id, "transcribe") == [404, 200]
    assert not requests_for(server, job_id, "failure")
    assert server.get_job(job_id)["attempts"] == 1  # finished on its first claim, never requeued
    assert HANDSHAKE_LOG in worker_logs(tmp_path)


def test_voicy_down_past_the_retry_budget_at_downloaded_the_job_still_completes_once(
        voicy: GatedVoicy, rt: VoicyRuntime, celery_workers: Callable[..., CeleryWorker],
        tmp_path: Path, fresh_redis: str) -> None:
    server, telegram, _gate, env = voicy
    job_id = enqueue_fixture(server, telegram, short_item())
    claimed_id, token = claim_without_sending(rt)
    assert claimed_id == job_id
    # Voicy answers 503 to every try of /downloaded and then of the /failure report
    server.inject_failure("downloaded", status=503, times=RETRY_ATTEMPTS)
    server.inject_failure("failure", status=503, times=RETRY_ATTEMPTS)
    with pytest.raises(RetryableJobError):
        pipeline.run_download(rt, job_id, token)  # the io task's body: its task fails
    assert server.get_job(job_id)["status"] == "downloading"
    assert len(stored_media(tmp_path)) == 1
    celery_workers("io", env)  # runs beat's reaper
    celery_workers("gpu", env)
    beat = start_beat(env, tmp_path, tmp_path / "beat.log")
    try:
        wait_final(server, [job_id], JOB_DONE_TIMEOUT_S)
        wait_fleet_clean(fresh_redis, tmp_path)
    finally:
        beat.stop()
    assert_completed_once(server, job_id)
    assert statuses(server, job_id, "downloaded") == [503] * RETRY_ATTEMPTS + [200]
    assert statuses(server, job_id, "failure") == [503] * RETRY_ATTEMPTS  # none ever landed
    assert server.get_job(job_id)["attempts"] == 1
    assert HANDSHAKE_LOG in worker_logs(tmp_path)


# ------------------------------------------------ 2. Voicy fails a held job: media still deleted
def test_a_stale_heartbeat_keeps_the_record_so_the_task_deletes_the_media(
        voicy: GatedVoicy, rt: VoicyRuntime, tmp_path: Path) -> None:
    server, telegram, _gate, _env = voicy
    job_id = enqueue_fixture(server, telegram, short_item())
    claimed_id, token = claim_without_sending(rt)
    assert claimed_id == job_id
    next_token = pipeline.run_download(rt, job_id, token)
    assert next_token and pipeline.confirm_grant(rt, job_id, next_token)  # its gpu task is queued
    assert len(stored_media(tmp_path)) == 1
    assert server.mark_chat_unreachable(server.get_job(job_id)["chatId"]) == 1

    assert pipeline.heartbeat_held(rt) == 0  # beat's heartbeat pass
    assert statuses(server, job_id, "heartbeat") == [404]
    assert transcription.run_transcription(rt, job_id, next_token) is False  # the queued task runs

    assert stored_media(tmp_path) == []
    assert rt.fleet.held_ids() == [] and rt.fleet.get(job_id) is None
    assert not rt.leases.alive(job_id)
    assert not requests_for(server, job_id, "failure") and not requests_for(server, job_id, "result")
    assert server.get_job(job_id)["status"] == "failed"


# ------------------------------------------ 3. the bridge cannot record a claim: nothing leaks
@pytest.mark.parametrize("written", [False, True], ids=["error-before-the-write", "error-after-the-write"])
def test_a_redis_error_recording_a_claim_frees_the_slot_and_hands_the_job_back(
        voicy: GatedVoicy, rt: VoicyRuntime, monkeypatch: pytest.MonkeyPatch, written: bool) -> None:
    server, telegram, _gate, _env = voicy
    job_id = enqueue_fixture(server, telegram, short_item())
    real_adopt = rt.fleet.adopt
    failures = [redis.ConnectionError("Connection reset by peer")]  # raised once

    def adopt_failing_once(*args: Any, **kwargs: Any) -> None:
        if written or not failures:
            real_adopt(*args, **kwargs)
        if failures:
            raise failures.pop()

    monkeypatch.setattr(rt.fleet, "adopt", adopt_failing_once)
    bridge = VoicyBridge(rt, never_sent, never_sent)
    with pytest.raises(redis.ConnectionError):
        bridge.cycle()
    assert rt.fleet.backlog_size() == 0  # the slot is free again
    assert rt.fleet.held_ids() == [] and rt.fleet.get(job_id) is None
    assert not rt.leases.alive(job_id)
    (failure,) = requests_for(server, job_id, "failure")
    assert failure["status"] == 200 and failure["json"]["retryable"] is True
    assert server.get_job(job_id)["status"] == "queued_for_download"

    assert bridge.cycle() == 1  # Redis is back: the requeued job is claimed and recorded whole
    assert rt.fleet.held_ids() == [job_id] and rt.fleet.backlog_size() == 1
    assert (rt.leases.holder(job_id) or "").startswith("granted:")
    assert server.get_job(job_id)["attempts"] == 2


@pytest.mark.parametrize("then", ["reclaimed", "reaped"])
def test_a_claim_whose_record_cannot_be_undone_either_goes_back_and_holds_one_slot(
        voicy: GatedVoicy, rt: VoicyRuntime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        then: str) -> None:
    """Redis is cut as the bridge records a claim, after the write went through, and stays cut while
    the bridge undoes it (``bench partitions``' voicy-bridge-redis). The job still goes back to Voicy;
    what the write left holds one backlog slot, not a second, and ends either way: the next claim of
    the job records it whole, or, once the pending grant expires, the reaper finds the job is not ours
    at Voicy (requeued) and forgets it, failing nothing there."""
    server, telegram, _gate, _env = voicy
    job_id = enqueue_fixture(server, telegram, short_item())
    cut = threading.Event()

    def unless_cut(call: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if cut.is_set():
                raise redis.TimeoutError("Timeout reading from socket")
            return call(*args, **kwargs)
        return guarded

    real_adopt = rt.fleet.adopt

    def adopt_then_cut(*args: Any, **kwargs: Any) -> None:
        real_adopt(*args, **kwargs)  # written; its answer is lost in the cut
        cut.set()
        raise redis.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(rt.fleet, "adopt", adopt_then_cut)
    for name in ("cancel_backlog", "forget"):
        monkeypatch.setattr(rt.fleet, name, unless_cut(getattr(rt.fleet, name)))
    monkeypatch.setattr(rt.leases, "release", unless_cut(rt.leases.release))
    with caplog.at_level(logging.WARNING), pytest.raises(redis.TimeoutError):
        VoicyBridge(rt, never_sent, never_sent).cycle()
    assert f"job {job_id}: could not undo a failed adoption: TimeoutError" in caplog.text
    assert f"job {job_id}: could not record the claim; handed it back to Voicy" in caplog.text
    assert statuses(server, job_id, "failure") == [200] and server.get_job(job_id)["status"] == "queued_for_download"

    cut.clear()  # the cut heals
    monkeypatch.setattr(rt.fleet, "adopt", real_adopt)
    assert rt.fleet.held_ids() == [job_id] and rt.fleet.backlog_size() == 1  # what the write left: one slot
    if then == "reclaimed":
        assert VoicyBridge(rt, never_sent, never_sent).cycle() == 1
        held = rt.fleet.get(job_id)
        assert held is not None and held.attempts == 2 and rt.fleet.backlog_size() == 1
        assert (rt.leases.holder(job_id) or "").startswith("granted:")
    else:
        rt.redis.delete(rt.leases.key(job_id))  # the pending grant's TTL ran out
        assert pipeline.reap(rt) == []
        assert statuses(server, job_id, "failure") == [200, 404]  # the reaper's: not the worker's job any more
        assert rt.fleet.held_ids() == [] and rt.fleet.backlog_size() == 0
        assert server.get_job(job_id)["status"] == "queued_for_download" and server.get_job(job_id)["attempts"] == 1


# ------------------------------------------------------------- 4. beat's voicy.heartbeat
def test_beat_heartbeats_held_jobs_with_a_live_lease_and_none_whose_lease_expired(
        voicy: GatedVoicy, rt: VoicyRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    import tasks.voicy

    server, telegram, _gate, _env = voicy
    live = enqueue_fixture(server, telegram, short_item(), file_id="fid-live")
    expired = enqueue_fixture(server, telegram, short_item(), file_id="fid-expired")

    def confirm_live_only(rt_: VoicyRuntime, job_id: str, token: str) -> None:
        """The live job's task is sent and its grant confirmed; the other's never is."""
        if job_id == live:
            assert pipeline.confirm_grant(rt_, job_id, token)

    assert VoicyBridge(rt, confirm_live_only, never_sent).cycle() == 2
    assert sorted(rt.fleet.held_ids()) == sorted([live, expired])
    wait_until(lambda: not rt.leases.alive(expired), LEASE_EXPIRY_TIMEOUT_S, "the unconfirmed grant to expire")
    assert rt.leases.alive(live)
    claimed_at = {j: server.get_job(j)["heartbeatAt"] for j in (live, expired)}
    server.advance_clock(SERVER_CLOCK_SKIP_S)
    seen = len(server.requests)

    monkeypatch.setattr(tasks.voicy, "_runtime", rt)  # the task's runtime() is this process's
    assert tasks.voicy.heartbeat() == 1  # the beat task, run here instead of on an io worker

    sent = [r for r in server.requests[seen:] if r["endpoint"] == "heartbeat"]
    assert [(r["job_id"], r["status"], r["client"]) for r in sent] == [(live, 200, "switchyard-recovery")]
    assert (server.get_job(live)["heartbeatAt"] - claimed_at[live]).total_seconds() >= SERVER_CLOCK_SKIP_S
    assert server.get_job(expired)["heartbeatAt"] == claimed_at[expired]
    assert sorted(rt.fleet.held_ids()) == sorted([live, expired])  # the reaper, not the heartbeat, ends jobs


# --------------------------------- 5. Redis goes away under a job: right after its result landed at Voicy,
# or while it downloads
@pytest.fixture()
def voicy_result_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OwnRedisStack]:
    """A Redis of its own (with an AOF, so a crash keeps its data), the dev Voicy API with a gate on
    ``/result``, fake Telegram, and this process as a fleet member on them. Production's lease TTL: no
    lease has to expire here, and a short one lost under load fences the result off (never posted)."""
    yield from _own_redis_gated(tmp_path, monkeypatch, "/result")


@pytest.fixture()
def voicy_source_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OwnRedisStack]:
    """The same with the gate on ``/source``: the download's first call; the recovery lease TTL (the
    download's lease expires within the test)."""
    yield from _own_redis_gated(tmp_path, monkeypatch, "/source", VOICY_WORKER_LEASE_TTL_MS=str(LEASE_TTL_MS))


def _own_redis_gated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str,
                     **env_overrides: str) -> Iterator[OwnRedisStack]:
    gate = Gate.path_suffix(suffix, once=True)
    own = services.start_redis(tmp_path / "redis", appendonly=True, appendfsync="always")
    try:
        with gated_voicy_dev_stack(gate, monkeypatch, tmp_path, own.url, "result-gate",
                                   **env_overrides) as (server, telegram, env):
            with fleet_runtime(env, monkeypatch) as rt:
                yield server, telegram, gate, (own, rt)
    finally:
        own.stop()


def test_redis_lost_after_the_result_landed_fails_neither_the_job_nor_the_task(
        voicy_result_gate: OwnRedisStack) -> None:
    """The transcription's result is accepted, then Redis is gone for its cleanup: the job is done (no
    ``failure`` after the result), the task ends normally, and the records wait for the reaper. It used
    to post a failure and end in an ERROR with a traceback (found by the chaos run's log budget)."""
    server, telegram, gate, (own, rt) = voicy_result_gate
    job_id = enqueue_fixture(server, telegram, short_item())
    claimed_id, token = claim_without_sending(rt)
    next_token = pipeline.run_download(rt, claimed_id, token)
    assert claimed_id == job_id and next_token and pipeline.confirm_grant(rt, job_id, next_token)
    gate.arm()
    outcome: list[object] = []
    task = threading.Thread(target=lambda: outcome.append(transcription.run_transcription(rt, job_id, next_token)))
    task.start()
    assert gate.arrived.wait(JOB_DONE_TIMEOUT_S), "the transcription never posted its result"
    services.kill(own)  # Redis crashes while the result is on its way to Voicy
    gate.open()
    task.join(JOB_DONE_TIMEOUT_S)
    assert outcome == [True]  # the task returned: no exception escaped it
    assert server.get_job(job_id)["status"] == "completed"
    assert not requests_for(server, job_id, "failure")
    services.start_again(own)
    assert rt.fleet.held_ids() == [job_id]  # left for the reaper, which ends it (the job is gone at Voicy)


def test_redis_lost_mid_download_fails_neither_the_job_nor_the_task(
        voicy_source_gate: OwnRedisStack, caplog: pytest.LogCaptureFixture) -> None:
    """Redis crashes while a download runs: our store is away, not the job. No ``failure`` goes to Voicy
    (it would requeue a job whose records we still hold), nothing escapes the task (Celery would log an
    error and a traceback), and once Redis is back the job's expired lease hands it to the reaper like a
    dead worker's. It used to post the Redis error as the job's failure and die in its cleanup (found by
    the chaos run's log budget)."""
    server, telegram, gate, (own, rt) = voicy_source_gate
    job_id = enqueue_fixture(server, telegram, short_item())
    claimed_id, token = claim_without_sending(rt)
    assert claimed_id == job_id
    gate.arm()
    outcome: list[object] = []
    task = threading.Thread(target=lambda: outcome.append(pipeline.run_download(rt, job_id, token)))
    task.start()
    assert gate.arrived.wait(DOWNLOAD_REACHED_TIMEOUT_S), "the download never asked for its source"
    services.kill(own)  # Redis crashes while the download is on its way
    gate.open()
    task.join(JOB_DONE_TIMEOUT_S)
    assert outcome == [None]  # no transcription token, and no exception escaped
    assert not requests_for(server, job_id, "failure")
    assert server.get_job(job_id)["status"] == "downloading"
    said = [r.getMessage() for r in caplog.records if r.name.startswith("workers.voicy")]
    assert any("Redis unavailable" in line for line in said), said  # what happened, not "lease lost"
    assert not any("lease lost" in line for line in said), said
    services.start_again(own)
    assert rt.fleet.held_ids() == [job_id]
    wait_until(lambda: not rt.leases.alive(job_id), LEASE_EXPIRY_TIMEOUT_S, "the download's lease to expire")
    assert pipeline.reap(rt) == []  # its media was never recorded: handed back to Voicy
    assert [r["json"] for r in requests_for(server, job_id, "failure")] == [
        {"error": pipeline.WORKER_LOST, "retryable": True}]
    assert server.get_job(job_id)["status"] == "queued_for_download"
