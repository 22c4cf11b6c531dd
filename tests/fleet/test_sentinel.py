"""High availability: ``REDIS_URL`` names Redis Sentinel, and a failover under load loses nothing.

Real redis-server processes on loopback: a master (AOF ``everysec``), a
replica and three Sentinels (``devstack.infra.sentinel``).
The whole Voicy side runs on it (``REDIS_URL=sentinel://...;...``,
``REDIS_SENTINEL_MASTER``): the bridge, the io and gpu pools and the
Procfile's beat. With jobs in flight the master is SIGKILLed; the Sentinels
promote the replica, and every job must still end completed with exactly one
accepted result, with no process exiting. The broker, the result backend,
RedBeat and every Redis client of the fleet (leases, fleet records) must have
followed the failover for that to hold.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.infra import sentinel
from devstack.infra.stack import AUDIO_DIR, audio_manifest
from tasks.routes import provider_queue
from tests.kit.cairn_stack import CairnStack
from tests.kit.celery_worker import CeleryWorker
from tests.kit.voicy_stack import voicy_dev_stack, voicy_fleet
from tests.kit.waiting import wait_until
from workers.redisconn import sync_client

pytestmark = pytest.mark.slow

JOBS = 6
CAIRN_JOBS = 8
READY_TIMEOUT_S = 60.0
JOB_DONE_TIMEOUT_S = 120.0
FINAL = ("completed", "failed")


@pytest.fixture()
def topology(tmp_path: Path) -> Iterator[sentinel.SentinelTopology]:
    topo = sentinel.start_sentinel_topology(tmp_path / "sentinel")
    try:
        yield topo
    finally:
        topo.stop()


def test_a_failover_under_voicy_load_loses_nothing(tmp_path: Path, topology: sentinel.SentinelTopology) -> None:
    with (voicy_dev_stack(tmp_path, topology.url, "sentinel",
                          REDIS_SENTINEL_MASTER=topology.master_name) as (server, telegram, env),
          voicy_fleet(env, tmp_path, io_concurrency=2) as fleet):  # ready from the log: no master name needed
        fleet.assert_alive()
        items = sorted(audio_manifest(), key=lambda m: m["duration_s"])[:2]
        ids = []
        for n in range(JOBS):
            data = (AUDIO_DIR / items[n % len(items)]["file"]).read_bytes()
            telegram.add_file(f"fid-{n}", data)
            ids.append(server.enqueue_job(f"fid-{n}", file_size=len(data), mime_type="audio/ogg"))
        # mid-load: the first job is done, the rest are claimed, downloading, queued or transcribing
        wait_until(lambda: any(server.get_job(j)["status"] == "completed" for j in ids), JOB_DONE_TIMEOUT_S,
                   "the first job to complete")
        assert not all(server.get_job(j)["status"] in FINAL for j in ids), "the load ended before the kill"
        held = sync_client(topology.url, master_name=topology.master_name).zcard("sy:voicy:held")
        topology.kill_master()
        topology.wait_failover()
        try:
            jobs = wait_until(lambda: (js := [server.get_job(j) for j in ids]) and
                              all(j["status"] in FINAL for j in js) and js,
                              JOB_DONE_TIMEOUT_S * 2, "every job to end after the failover", interval_s=0.2)
        except AssertionError as exc:  # say which job is stuck where, with the fleet's logs
            states = {j: server.get_job(j)["status"] for j in ids}
            raise AssertionError(f"{exc}: {states}\n{fleet.logs(tail_chars=3000)}") from None
        fleet.assert_alive()
    assert held >= 1, "no job was in flight when the master died"
    assert isinstance(jobs, list)
    for job_id, job in zip(ids, jobs, strict=True):
        assert job["status"] == "completed", (job.get("lastError"), fleet.logs(tail_chars=3000)[-4000:])
        accepted = [r for r in server.requests if r["path"].endswith(f"/jobs/{job_id}/result") and r["status"] == 200]
        assert len(accepted) == 1, (job_id, accepted)
    # the promoted replica is the master every client now uses
    assert topology.master_port() == topology.replica.port


class SentinelCairnStack(CairnStack):
    """The Cairn test stack on a Sentinel ``REDIS_URL`` (no flush through a plain client, readiness from logs)."""

    def _flush(self) -> None:
        """A Sentinel URL is no plain Redis URL, and the topology is fresh for this test."""

    def start_worker(self, concurrency: int = 2) -> CeleryWorker:
        name = f"provider-{len(self.workers)}-{uuid.uuid4().hex[:4]}@test"
        worker = CeleryWorker(provider_queue(self.pool), self.env, self.tmp / f"worker-{len(self.workers)}.log",
                              concurrency=concurrency, name=name)
        self.workers.append(worker)
        wait_until(lambda: " ready." in worker.log() or worker.proc.poll() is not None, READY_TIMEOUT_S,
                   "the provider worker to be ready")
        return worker


def test_a_failover_under_cairn_load_loses_nothing(tmp_path: Path, topology: sentinel.SentinelTopology,
                                                   s3_endpoint: str) -> None:
    stack = SentinelCairnStack(tmp_path, topology.url, s3_endpoint,
                               extra_env={"REDIS_SENTINEL_MASTER": topology.master_name}).start()
    try:
        stack.start_worker(concurrency=2)
        stack.start_bridge()
        acct = stack.connect_athlete(n_activities=CAIRN_JOBS)
        jobs = [stack.fetch_job(acct, str(ext)) for ext in
                sorted(stack.strava.athlete(int(acct.external_id)).activities)]
        for job in jobs[: CAIRN_JOBS // 2]:
            stack.core.enqueue_job("fetch_source", job)
        stack.core.router.wait(lambda: bool(stack.results_for(jobs[0]["job_id"])), JOB_DONE_TIMEOUT_S,
                               "a first result")
        topology.kill_master()
        for job in jobs[CAIRN_JOBS // 2:]:
            stack.core.enqueue_job("fetch_source", job)
        topology.wait_failover()
        stack.core.router.wait(lambda: all(stack.results_for(j["job_id"]) for j in jobs), JOB_DONE_TIMEOUT_S * 2,
                               "every job's result after the failover")
        assert all(len({r.msg_id for r in stack.results_for(j["job_id"])}) == 1 for j in jobs)
        wait_until(lambda: all(c["num_pending"] == 0 and c["num_ack_pending"] == 0
                               for c in stack.core.consumers()), JOB_DONE_TIMEOUT_S, "every message acked")
        assert stack.bridge is not None and stack.bridge.proc.poll() is None
    finally:
        stack.stop()
