"""Graceful shutdown of the Voicy side under load: SIGTERM each process type, nothing lost or run twice.

The dyno manager's stop (``tests/kit/dyno_stop.py``) goes to the whole process
group, and the workers run as the Procfile runs them (``REMAP_SIGTERM=SIGQUIT``:
a cold shutdown after ``WORKER_SOFT_SHUTDOWN_TIMEOUT_S``). Everything is a real
process; only the external systems are fakes (dev Voicy API, fake Telegram).
A *gate* in front of one fake endpoint holds a request for as long as a test
needs, so "mid-transcription" and "mid-download" are states the test waits
for, not timing guesses. The Cairn side's stops are in test_cairn_shutdown.py.

The Voicy processes a test does not signal are the module's shared fleet
(``tests/kit/shared_fleet.py``: started once, not once per test); the one it
signals, and its replacement, are the test's own.

Lease TTLs are long (60 s): a job recovered within the test deadline proves it
was *handed back* at shutdown, not found after its lease expired.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.infra.log_budget import Allow
from devstack.infra.stack import AUDIO_DIR, audio_manifest, start_beat, start_bridge
from tests.kit.celery_worker import CeleryWorker
from tests.kit.dyno_stop import PROCFILE_SOFT_WINDOW_S, QUICK_DRAIN_LIMIT_S, WORKER_EXIT_GRACE_S, terminate
from tests.kit.gate import Gate
from tests.kit.shared_fleet import SharedVoicyFleet, shared_voicy_fleet
from tests.kit.waiting import wait_until

# H1: no process's stop logs a WARNING that no allow-list entry explains (tests/conftest.py ``log_budget``).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("log_budget")]

BRIDGE_EXIT_LIMIT_S = 5.0
LONG_LEASE_TTL_MS = "60000"  # a lease that expired would recover the job only after this
RECOVERY_DEADLINE_S = 45.0  # < the long lease TTL: recovery this fast means it was handed back
MODEL_READY_TIMEOUT_S = 90.0  # the first transcription loads the model
JOB_DONE_TIMEOUT_S = 120.0
FINAL = ("completed", "failed")
# What a worker stopped mid-job says, as the test wants it to (both lines are in docs/operations.md §7).
LOG_BUDGET_ALLOW = [
    Allow(r"job \w+: worker shutting down mid-job; handed back for recovery",
          reason="the test stops the worker while the job runs past the soft window: it hands the job back",
          provoked_by="test_sigterm_io_mid_download_hands_jobs_back_and_each_completes_once "
                      "test_sigterm_gpu_mid_transcription_hands_the_job_back_and_it_completes_once"),
    Allow(r"job \w+ failed \(retryable=True\): worker lost before the media was stored",
          reason="the reaper reports a handed-back download retryable, so Voicy requeues it for a fresh one",
          provoked_by="test_sigterm_io_mid_download_hands_jobs_back_and_each_completes_once"),
    Allow(r"job \w+: worker lost; redispatching transcription",
          reason="the reaper redispatches the transcription the stopped gpu worker handed back (the test asserts it)",
          provoked_by="test_sigterm_gpu_mid_transcription_hands_the_job_back_and_it_completes_once"),
]
SHORT_SOFT_WINDOW_S = 1.0  # a window a slow download outlasts
SharedVoicy = tuple[Any, Any, Gate, dict[str, str], SharedVoicyFleet]  # server, telegram, gate, environment, fleet


# --------------------------------------------------------------------------- helpers
def requests_for(server: Any, job_id: str, endpoint: str) -> list[dict]:
    return [r for r in server.requests if r["path"].endswith(f"/jobs/{job_id}/{endpoint}")]


def claims(server: Any, since: int = 0) -> list[dict]:
    """The claims the dev Voicy API received, from its ``since``-th request on."""
    return [r for r in server.requests[since:] if r["path"].endswith(("/claim-download", "/claim-ready"))]


def enqueue(server: Any, telegram: Any, item: dict, file_id: str) -> tuple[str, str]:
    data = (AUDIO_DIR / item["file"]).read_bytes()
    path = telegram.add_file(file_id, data)
    return server.enqueue_job(file_id, file_size=len(data), mime_type="audio/ogg"), path


def wait_final(server: Any, job_ids: list[str], timeout_s: float = JOB_DONE_TIMEOUT_S) -> dict[str, dict]:
    def done() -> dict[str, dict] | None:
        jobs = {j: server.get_job(j) for j in job_ids}
        return jobs if all(job["status"] in FINAL for job in jobs.values()) else None
    return wait_until(done, timeout_s, "jobs to reach a final state", interval_s=0.2)


def assert_completed_once(server: Any, jobs: dict[str, dict], logs: str = "") -> None:
    for job_id, job in jobs.items():
        assert job["status"] == "completed", (job_id, job.get("lastError"), logs[-3000:])
        results = requests_for(server, job_id, "result")
        assert [r["status"] for r in results] == [200], (job_id, results)


def all_logs(tmp: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(tmp.glob("*.log")))


def long_item() -> dict:
    """The clip long enough to send progress mid-transcription (the gate holds that call)."""
    return max(audio_manifest(), key=lambda m: m["duration_s"])


def short_items(n: int) -> list[dict]:
    items = sorted(audio_manifest(), key=lambda m: m["duration_s"])[:-1]  # the five short clips
    return [items[i % len(items)] for i in range(n)]


# --------------------------------------------------------------------------- Voicy stack
@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SharedVoicyFleet, Gate]]:
    """Dev Voicy API (with a gate on ``progress``), fake Telegram, and the fleet members a test does not stop
    (tests/kit/shared_fleet.py): each test runs ``only`` the shared kinds it keeps, and starts its own of
    the kind it SIGTERMs, so no shared process takes that one's work. Long leases for every process."""
    gate = Gate.path_suffix("/progress", once=True)  # once: a replacement worker must get through
    with shared_voicy_fleet(tmp_path_factory.mktemp("shutdown-fleet"), "shutdown", io_concurrency=2, members=(),
                            gate=gate, VOICY_WORKER_LEASE_TTL_MS=LONG_LEASE_TTL_MS) as fleet:
        yield fleet, gate


@pytest.fixture()
def voicy(shared_fleet: tuple[SharedVoicyFleet, Gate],
          tmp_path: Path) -> Iterator[SharedVoicy]:
    """The shared dev Voicy API, fake Telegram, gate, fleet environment and fleet, for one test."""
    fleet, gate = shared_fleet
    with fleet.attributed(tmp_path):
        try:
            yield fleet.server, fleet.telegram, gate, fleet.env, fleet
        finally:
            gate.open()  # before the fleet waits for its jobs: a held request must not keep it waiting


def procfile_worker_env(env: dict[str, str], soft_shutdown_s: float) -> dict[str, str]:
    """How the Procfile runs gpu/io/provider: SIGTERM means a cold shutdown after the soft window."""
    return dict(env, REMAP_SIGTERM="SIGQUIT", WORKER_SOFT_SHUTDOWN_TIMEOUT_S=str(soft_shutdown_s))


# --------------------------------------------------------------------------- Voicy bridge
def test_sigterm_bridge_under_load_stops_claiming_and_claimed_jobs_complete_once(
        voicy: SharedVoicy, tmp_path: Path) -> None:
    server, telegram, _gate, env, fleet = voicy
    fleet.only("io", "gpu")  # the bridge is this test's own
    env = dict(env, VOICY_WORKER_READY_QUEUE_LIMIT="2")
    start = len(server.requests)
    ids = [enqueue(server, telegram, item, f"fid-b{n}")[0] for n, item in enumerate(short_items(8))]
    bridge = start_bridge(env, tmp_path / "bridge.log")
    try:
        wait_until(lambda: sum(1 for r in claims(server, start) if r["endpoint"] == "claim-download"
                               and r["status"] == 200) >= 3, MODEL_READY_TIMEOUT_S, "three claims")
        seen = len(claims(server, start))
        exited_s, killed = terminate(bridge.proc, BRIDGE_EXIT_LIMIT_S)
    finally:
        bridge.stop()
    assert not killed and exited_s < BRIDGE_EXIT_LIMIT_S, (exited_s, bridge.log()[-2000:])
    assert bridge.proc.returncode == 0, bridge.log()[-2000:]
    assert "voicy bridge stopped" in bridge.log()
    # At most the one claim already on the wire when the signal landed; none started later.
    assert len(claims(server, start)) - seen <= 1, claims(server, start)[seen:]

    claimed = [j for j in ids if server.get_job(j)["status"] != "queued_for_download"]
    waiting = [j for j in ids if j not in claimed]
    assert claimed and waiting, "the bridge must be stopped mid-load"
    jobs = wait_final(server, claimed)  # no bridge runs: the workers alone finish what was claimed
    assert_completed_once(server, jobs, all_logs(tmp_path))
    assert {server.get_job(j)["status"] for j in waiting} == {"queued_for_download"}

    # Nothing leaked (backlog reservations, held records): a new instance takes the rest at once.
    restarted = start_bridge(env, tmp_path / "bridge-2.log")
    try:
        jobs = wait_final(server, waiting)
    finally:
        restarted.stop()
    assert_completed_once(server, jobs, all_logs(tmp_path))
    assert all(server.get_job(j)["attempts"] == 1 for j in ids)


# --------------------------------------------------------------------------- gpu worker
def test_sigterm_gpu_mid_transcription_hands_the_job_back_and_it_completes_once(
        voicy: SharedVoicy, celery_workers: Callable[..., CeleryWorker], tmp_path: Path) -> None:
    """Cold shutdown with no soft window: the task is cancelled, releases its lease, the reaper
    redispatches at once (well before the 60 s lease would expire), a replacement finishes it."""
    server, telegram, gate, env, fleet = voicy
    fleet.only("io", "bridge")  # the gpu worker is this test's own
    assert env["VOICY_WORKER_LEASE_TTL_MS"] == LONG_LEASE_TTL_MS
    gate.arm()
    job_id, _ = enqueue(server, telegram, long_item(), "fid-gpu")
    gpu = celery_workers("gpu", procfile_worker_env(env, 0))
    beat = start_beat(env, tmp_path, tmp_path / "beat.log")
    try:
        assert gate.arrived.wait(MODEL_READY_TIMEOUT_S), "transcription never sent progress"
        exited_s, killed = terminate(gpu.proc)
        gate.open()
        assert not killed, (exited_s, gpu.log()[-3000:])
        assert server.get_job(job_id)["status"] == "transcribing"
        assert "handed back for recovery" in gpu.log(), gpu.log()[-3000:]
        celery_workers("gpu", env)  # the replacement dyno
        jobs = wait_final(server, [job_id], RECOVERY_DEADLINE_S)
    finally:
        beat.stop()
    assert_completed_once(server, jobs, all_logs(tmp_path))
    assert not requests_for(server, job_id, "failure")
    assert re.search(rf"job {job_id}: .*redispatching transcription", all_logs(tmp_path) + fleet.text())


def test_sigterm_gpu_within_the_soft_window_finishes_the_job_and_exits_as_it_ends(
        voicy: SharedVoicy, celery_workers: Callable[..., CeleryWorker], tmp_path: Path) -> None:
    """The Procfile's soft window lets a running transcription finish on the dying worker (nothing is
    redispatched or repeated), and the worker exits as soon as it has, not at the window's end
    (tasks/hardening/quick_drain.py)."""
    server, telegram, gate, env, fleet = voicy
    fleet.only("io", "bridge")  # the gpu worker is this test's own; no beat: only the dying worker can finish it
    assert env["VOICY_WORKER_LEASE_TTL_MS"] == LONG_LEASE_TTL_MS
    gate.arm()
    job_id, _ = enqueue(server, telegram, long_item(), "fid-soft")
    gpu = celery_workers("gpu", procfile_worker_env(env, PROCFILE_SOFT_WINDOW_S))
    assert gate.arrived.wait(MODEL_READY_TIMEOUT_S), "transcription never sent progress"
    signalled = time.monotonic()
    os.killpg(gpu.proc.pid, signal.SIGTERM)
    wait_until(lambda: "Soft shutdown: waiting" in gpu.log(), 10, "the soft shutdown")
    gate.open()  # Voicy answers the held progress call; the task runs on
    jobs = wait_final(server, [job_id], PROCFILE_SOFT_WINDOW_S + 10)
    job_ended = time.monotonic()  # the result is posted: the task's last lines run now
    gpu.proc.wait(WORKER_EXIT_GRACE_S)
    exited = time.monotonic()
    assert_completed_once(server, jobs, gpu.log())
    assert "handed back" not in gpu.log()
    assert len(requests_for(server, job_id, "transcribe")) == 1
    assert "Soft shutdown: work in hand ended" in gpu.log(), gpu.log()[-3000:]
    assert exited - job_ended < QUICK_DRAIN_LIMIT_S, (exited - job_ended, exited - signalled, gpu.log()[-3000:])
    assert gpu.proc.returncode == 0, gpu.log()[-3000:]


# --------------------------------------------------------------------------- io worker
def test_sigterm_io_mid_download_hands_jobs_back_and_each_completes_once(
        voicy: SharedVoicy, celery_workers: Callable[..., CeleryWorker], tmp_path: Path) -> None:
    server, telegram, _gate, env, fleet = voicy
    fleet.only("gpu", "bridge")  # the io worker is this test's own
    assert env["VOICY_WORKER_LEASE_TTL_MS"] == LONG_LEASE_TTL_MS
    pairs = [enqueue(server, telegram, item, f"fid-io{n}") for n, item in enumerate(short_items(2))]
    ids = [job_id for job_id, _ in pairs]
    for n in range(len(pairs)):
        telegram.delay(f"fid-io{n}", 10.0)  # a slow Telegram file server
    io = celery_workers("io", procfile_worker_env(env, SHORT_SOFT_WINDOW_S), concurrency=2)
    beat = start_beat(env, tmp_path, tmp_path / "beat.log")
    try:
        paths = {path for _, path in pairs}
        wait_until(lambda: paths <= {r["path"] for r in telegram.requests_of("download") if r["status"] == 0},
                   60, "both downloads in flight")
        exited_s, killed = terminate(io.proc)
        assert not killed, (exited_s, io.log()[-3000:])
        assert "window over after" in io.log(), io.log()[-3000:]  # the downloads outlasted it: handed back
        for job_id in ids:
            assert f"job {job_id}: worker shutting down mid-job; handed back" in io.log(), io.log()[-3000:]
        telegram.clear_faults()
        celery_workers("io", env, concurrency=2)  # the replacement dyno
        jobs = wait_final(server, ids, RECOVERY_DEADLINE_S)
    finally:
        beat.stop()
    assert_completed_once(server, jobs, all_logs(tmp_path))
    for job_id in ids:
        failures = requests_for(server, job_id, "failure")
        # handed back = one retryable failure, so Voicy requeued it for a fresh download
        assert [(f["status"], f["json"]["retryable"]) for f in failures] == [(200, True)], failures
        assert server.get_job(job_id)["attempts"] == 2
