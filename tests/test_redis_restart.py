"""R1: every long-running process rides out a Redis restart, with and without data loss.

Redis here is our own redis-server (AOF, ``appendfsync always``) on a fixed
port; ``restart`` SIGKILLs it (a crash), keeps it down for a few seconds and
starts it on the same port, either on its AOF (data kept) or empty (data lost).
Under it run the real processes: ``python -m bridges voicy``/``cairn``, the
io, gpu and provider Celery workers, and the Procfile's ``beat`` line. None
may exit; each must resume, shown by a job submitted after each restart
completing with exactly one result, and by beat scheduling again.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deploy.devstack import services
from deploy.devstack.procs import Proc, spawn
from tests.cairn_stack import WAIT_S, CairnStack
from tests.conftest import CeleryWorker, wait_until
from tests.test_procfile import procfile_entries
from tests.voicy_stack import audio_manifest, start_bridge, voicy_dev_stack

pytestmark = pytest.mark.slow

DOWN_S = 3.0  # how long Redis stays down per restart
JOB_DONE_TIMEOUT_S = 180.0
RESUME_TIMEOUT_S = 90.0
SHELL = shutil.which("bash") or "/bin/sh"
OUTAGE_LINE = "Redis unavailable at REDIS_URL"
RECOVERY_LINE = "Redis available again"


class RestartableRedis:
    """A redis-server this test may crash and restart on the same port."""

    def __init__(self, workdir: Path) -> None:
        self.svc = services.start_redis(workdir, appendonly=True, appendfsync="always")
        self.url = self.svc.url

    def restart(self, *, keep_data: bool) -> None:
        self.svc = services.restart_redis(self.svc, keep_data=keep_data, down_s=DOWN_S)

    def stop(self) -> None:
        self.svc.stop()


@pytest.fixture()
def own_redis(tmp_path: Path) -> Iterator[RestartableRedis]:
    r = RestartableRedis(tmp_path / "redis")
    try:
        yield r
    finally:
        r.stop()


def start_procfile_beat(env: dict[str, str], log_path: Path) -> Proc:
    """The Procfile's own ``beat`` line (the RedBeat scheduler that keeps its lock), ``celery`` from this venv."""
    env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}
    return spawn([SHELL, "-c", procfile_entries()["beat"]], env, log_path)


def assert_alive(procs: dict[str, Callable[[], int | None]], logs: Callable[[], str]) -> None:
    dead = {name: code for name, poll in procs.items() if (code := poll()) is not None}
    assert not dead, f"exited: {dead}\n{logs()[-4000:]}"


# ----------------------------------------------------------------------------------- Voicy
def test_voicy_bridge_workers_and_beat_ride_out_redis_restarts(tmp_path: Path, own_redis: RestartableRedis) -> None:
    with voicy_dev_stack(tmp_path, own_redis.url, "restart") as (server, telegram, env):
        item = min(audio_manifest(), key=lambda m: m["duration_s"])
        data = (Path(__file__).parent / "fixtures" / "audio" / item["file"]).read_bytes()
        io = CeleryWorker("io", env, tmp_path / "io.log")
        gpu = CeleryWorker("gpu", env, tmp_path / "gpu.log")
        for worker in (io, gpu):
            worker.wait_ready(own_redis.url)
        bridge = start_bridge(env, tmp_path / "bridge.log")
        beat = start_procfile_beat(env, tmp_path / "beat.log")
        procs = {"io": io.proc.poll, "gpu": gpu.proc.poll, "bridge": bridge.proc.poll, "beat": beat.proc.poll}

        def logs() -> str:
            return "\n".join(f"--- {n}\n{t}" for n, t in (("io", io.log()), ("gpu", gpu.log()),
                                                         ("bridge", bridge.log()), ("beat", beat.log())))

        def one_job(n: int) -> None:
            telegram.add_file(f"fid-{n}", data)
            job_id = server.enqueue_job(f"fid-{n}", file_size=len(data), mime_type="audio/ogg")
            job = wait_until(lambda: (j := server.get_job(job_id))["status"] in ("completed", "failed") and j,
                             JOB_DONE_TIMEOUT_S, f"job {n} to finish", interval_s=0.2)
            assert job["status"] == "completed", (job.get("lastError"), logs()[-4000:])  # type: ignore[index]
            results = [r["status"] for r in server.requests if r["path"].endswith(f"/jobs/{job_id}/result")]
            assert results == [200], results

        try:
            wait_until(lambda: "beat: Acquired lock" in beat.log(), WAIT_S, "beat to take the lock")
            one_job(0)
            for n, keep_data in enumerate((True, False), start=1):
                reaps_before = io.log().count("voicy.reap[")
                own_redis.restart(keep_data=keep_data)
                assert_alive(procs, logs)
                one_job(n)
                # beat schedules again, and the io pool consumes what it sends
                wait_until(lambda: io.log().count("voicy.reap[") > reaps_before, RESUME_TIMEOUT_S,
                           "a voicy.reap sent by beat after the restart")
                assert_alive(procs, logs)
        finally:
            for proc in (bridge, beat):
                proc.stop()
            for worker in (io, gpu):
                worker.stop()
        # one warning per outage, not one per retry; and each outage ends with a recovery line
        assert bridge.log().count(OUTAGE_LINE) == 2 and bridge.log().count(RECOVERY_LINE) == 2, bridge.log()
        assert beat.log().count("beat: Acquired lock") == 2, beat.log()  # re-taken after the data loss
        assert "Traceback" not in bridge.log() + beat.log()


# ----------------------------------------------------------------------------------- Cairn
def test_cairn_bridge_provider_worker_and_presence_ride_out_redis_restarts(
        tmp_path: Path, own_redis: RestartableRedis, s3_endpoint: str) -> None:
    stack = CairnStack(tmp_path, own_redis.url, s3_endpoint).start()
    try:
        worker = stack.start_worker()
        bridge = stack.start_bridge()
        procs = {"provider": worker.proc.poll, "bridge": bridge.proc.poll}
        acct = stack.connect_athlete(n_activities=3)
        activities = sorted(stack.strava.athlete(int(acct.external_id)).activities)  # type: ignore[union-attr]
        assert stack.core is not None

        def one_job(n: int) -> None:
            job = stack.fetch_job(acct, str(activities[n]))
            stack.core.enqueue_job("fetch_source", job)  # type: ignore[union-attr]
            stack.core.router.wait(lambda: bool(stack.results_for(job["job_id"])), RESUME_TIMEOUT_S,  # type: ignore[union-attr]
                                   f"job {n}'s result")
            assert len({r.msg_id for r in stack.results_for(job["job_id"])}) == 1

        one_job(0)
        for n, keep_data in enumerate((True, False), start=1):
            own_redis.restart(keep_data=keep_data)
            assert_alive(procs, stack.all_logs)
            one_job(n)
            assert_alive(procs, stack.all_logs)
        key = next(iter(stack.core.live_presence(stack.pool)))
        assert key  # presence never depended on Redis
    finally:
        stack.stop()
