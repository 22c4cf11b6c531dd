"""Graceful shutdown under load: SIGTERM each process type, then prove nothing is lost or run twice.

Heroku sends SIGTERM to every process of a dyno and SIGKILL 30 s later
(reference/ecosystem.md §5), so every signal here goes to the whole process
group, and the workers run as the Procfile runs them (``REMAP_SIGTERM=SIGQUIT``:
a cold shutdown after ``WORKER_SOFT_SHUTDOWN_TIMEOUT_S``). Everything is a real
process; only the external systems are fakes (dev Voicy API, fake Telegram,
dev Cairn core, fake Strava). A *gate* in front of one fake endpoint holds a
request for as long as a test needs, so "mid-transcription" and "mid-download"
are states the test waits for, not timing guesses.

The Voicy processes a test does not signal are the module's shared fleet
(``tests/kit/shared_fleet.py``: started once, not once per test); the one it
signals, and its replacement, are the test's own.

Lease TTLs are long (60 s) in the Voicy tests: a job recovered within the test
deadline proves it was *handed back* at shutdown, not found after its lease expired.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from devstack.infra import procfile
from devstack.infra.log_budget import Allow
from devstack.infra.procs import Proc, signal_group
from devstack.infra.stack import AUDIO_DIR, audio_manifest, start_beat, start_bridge
from tasks.hardening.transport import queue_keys
from tasks.routes import provider_queue
from tasks.settings import WORKER_SOFT_SHUTDOWN_TIMEOUT_S
from tests.kit.cairn_stack import WAIT_S, CairnStack
from tests.kit.celery_worker import CeleryWorker
from tests.kit.garmin_stack import GarminStack
from tests.kit.gate import Gate
from tests.kit.shared_fleet import SharedVoicyFleet, shared_voicy_fleet
from tests.kit.waiting import wait_until

# H1: no process's stop logs a WARNING that no allow-list entry explains (tests/conftest.py ``log_budget``).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("log_budget")]

HEROKU_KILL_AFTER_S = 30.0  # SIGTERM → SIGKILL on Heroku
BRIDGE_EXIT_LIMIT_S = 5.0
WORKER_EXIT_GRACE_S = 25.0  # below HEROKU_KILL_AFTER_S: we SIGKILL only if this is exceeded
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
    Allow(r"Cold shutdown: a task still running in a thread cannot be killed",
          reason="the test stops the garmin worker with no soft window while Garmin holds its fetch",
          provoked_by="test_sigterm_garmin_past_the_soft_window_leaves_the_fetch_to_end_and_exits_cleanly"),
]
PROCFILE_SOFT_WINDOW_S = WORKER_SOFT_SHUTDOWN_TIMEOUT_S  # the window the Procfile's workers run with
# A stopping worker exits this soon after its last task in hand ended. One that waited the window out
# would exit about 8 s after a job that ends in the window's first 2 s; a loaded 2-core box took 2.5 s
# to exit as it should, so the bound sits between the two. The log line is the causal proof.
QUICK_DRAIN_LIMIT_S = PROCFILE_SOFT_WINDOW_S / 2
SHORT_SOFT_WINDOW_S = 1.0  # a window a slow download outlasts
SharedVoicy = tuple[Any, Any, Gate, dict[str, str], SharedVoicyFleet]  # server, telegram, gate, environment, fleet


# --------------------------------------------------------------------------- helpers
def terminate(proc: subprocess.Popen[bytes], grace_s: float = WORKER_EXIT_GRACE_S) -> tuple[float, bool]:
    """SIGTERM the process group as the dyno manager does; SIGKILL if it outlives ``grace_s``.

    Returns (seconds until exit, whether SIGKILL was needed)."""
    started = time.monotonic()
    killed = signal_group(proc, signal.SIGTERM, grace_s)
    return time.monotonic() - started, killed


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


# --------------------------------------------------------------------------- Cairn bridge
@pytest.fixture()
def cairn(tmp_path: Path, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    stack = CairnStack(tmp_path, redis_url, s3_endpoint).start()
    try:
        yield stack
    finally:
        stack.stop()


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
