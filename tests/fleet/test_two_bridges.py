"""Two bridges per side work together: every job is claimed once, none is lost (issue 15 §4).

Real processes on loopback, started from the Procfile's own lines as a
deployment with a second bridge runs them: two ``voicy_bridge`` over one dev
Voicy API (the same worker token, one fleet) beside ``io`` and ``gpu``, and two
``cairn_bridge`` of one pool beside its ``provider`` worker. The work itself
takes no time (the null provider and engine, installed as a plug-in
distribution: ``bench/plugins``), so the jobs race
through the bridges and only their coordination is tested: Voicy's claims and
the fleet-wide backlog in Redis, JetStream's shared durable consumer and the
job leases.
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from functools import partial
from pathlib import Path

import pytest

from bench.plugins import NULL, NullKit, install_null
from devstack.infra import procfile
from devstack.infra.cairn_stack import CairnStack
from devstack.infra.procs import Proc
from devstack.infra.stack import AUDIO_DIR, audio_manifest
from tests.kit.voicy_stack import voicy_dev_stack
from tests.kit.waiting import wait_until
from workers.providers.kinds import FETCH_SOURCE

# starts fleet processes (tests/kit/fleet_guard.py); H1: every dyno's log ends with an empty budget
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("log_budget")]

VOICY_JOBS = 24
CAIRN_JOBS = 30
ACCOUNTS = 3
BRIDGES = 2
CAIRN_IN_FLIGHT = 2  # per bridge: neither can take the whole burst
START_WAIT_S = 60.0
DONE_WAIT_S = 240.0
FINAL = ("completed", "failed")
# The demo's poll, not the suite's slower one, and every download held a moment: with instant jobs a
# slot freed while the bridge that just claimed was still in its claim loop, so that bridge took the
# next claim too and, in two quiet full runs, all 24 ([0, 24], [24, 0]). Held, the downloads keep the
# backlog full: each bridge ends up waiting, and a freed slot wakes the longest waiter (BLPOP).
DEMO_POLL_INTERVAL_MS = "200"
DOWNLOAD_HOLD_S = 0.3
READY = " ready."  # a Celery worker's start-up line
VOICY_CLAIMED = re.compile(r"claimed job (\w+) for download")
CAIRN_ACKED = re.compile(r"ack fetch_source seq (\d+) \(delivery (\d+)\)")


@pytest.fixture(scope="module")
def null_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_null(tmp_path_factory.mktemp("site-packages"))


def test_two_voicy_bridges_claim_each_job_once_and_every_job_completes(tmp_path: Path, fresh_redis: str,
                                                                      null_site: Path) -> None:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # a line says celery
    with voicy_dev_stack(tmp_path, fresh_redis, "two-bridges", VOICY_WORKER_TRANSCRIBER=NULL,
                         PYTHONPATH=str(null_site), PATH=path,
                         VOICY_WORKER_POLL_INTERVAL_MS=DEMO_POLL_INTERVAL_MS) as (server, telegram, env):
        workers = [_line(name, env, tmp_path) for name in ("io", "gpu")]
        bridges: list[Proc] = []
        try:
            for worker in workers:
                wait_until(partial(_logged, worker, READY), START_WAIT_S, "a worker to start")
            bridges = [_line("voicy_bridge", env, tmp_path, i) for i in range(BRIDGES)]
            for bridge in bridges:
                wait_until(partial(_logged, bridge, "voicy bridge started"), START_WAIT_S, "a bridge to start")
            data = (AUDIO_DIR / audio_manifest()[0]["file"]).read_bytes()
            ids = []
            for n in range(VOICY_JOBS):
                telegram.add_file(f"fid-two-{n}", data)
                telegram.delay(f"fid-two-{n}", DOWNLOAD_HOLD_S)
                ids.append(server.enqueue_job(f"fid-two-{n}", file_size=len(data), mime_type="audio/ogg"))
            wait_until(lambda: all(server.get_job(j)["status"] in FINAL for j in ids), DONE_WAIT_S,
                       "every job to end")
        finally:
            for bridge in bridges:
                bridge.stop()
            for worker in workers:
                worker.stop()
    assert [server.get_job(j)["status"] for j in ids] == ["completed"] * VOICY_JOBS
    assert [server.get_job(j)["attempts"] for j in ids] == [1] * VOICY_JOBS  # Voicy counts each claim
    assert sum(1 for r in server.requests_for("claim-download") if r["status"] == 200) == VOICY_JOBS
    assert Counter(r["job_id"] for r in server.requests_for("result")) == Counter({j: 1 for j in ids})
    by_bridge = [set(VOICY_CLAIMED.findall(b.log())) for b in bridges]
    assert all(by_bridge), f"one bridge claimed nothing: {[len(c) for c in by_bridge]}"
    assert not by_bridge[0] & by_bridge[1] and by_bridge[0] | by_bridge[1] == set(ids)


def test_two_cairn_bridges_of_one_pool_run_each_job_once_and_ack_every_message(tmp_path: Path, redis_url: str,
                                                                             s3_endpoint: str,
                                                                             null_site: Path) -> None:
    stack = CairnStack(tmp_path / "cairn", redis_url=redis_url, s3_endpoint=s3_endpoint,
                       fakes=[NullKit(null_site)]).start()
    pool = stack.pool(NULL)
    env = stack.env(pool, CAIRN_MAX_IN_FLIGHT=str(CAIRN_IN_FLIGHT), PROVIDER_CONCURRENCY="4")
    worker = _line("provider", env, tmp_path)
    bridges: list[Proc] = []
    try:
        wait_until(lambda: READY in worker.log(), START_WAIT_S, "the provider worker to start")
        bridges = [_line("cairn_bridge", env, tmp_path, i) for i in range(BRIDGES)]
        for bridge in bridges:
            wait_until(partial(_logged, bridge, "cairn bridge started"), START_WAIT_S, "a bridge to start")
        accounts = [stack.connect(pool, CAIRN_JOBS // ACCOUNTS) for _ in range(ACCOUNTS)]
        jobs = stack.fetch_jobs(accounts)
        assert stack.core is not None
        for job in jobs:
            stack.core.enqueue_job(FETCH_SOURCE, job)
        ids = {job["job_id"] for job in jobs}
        stack.core.router.wait(lambda: all(stack.results_for(j) for j in ids), DONE_WAIT_S, "every job's result")
        wait_until(lambda: len(_acked(bridges)) >= CAIRN_JOBS, DONE_WAIT_S, "every message acked")
        consumer = stack.consumer(pool, FETCH_SOURCE)
    finally:
        for bridge in bridges:
            bridge.stop()
        worker.stop()
        stack.stop()
    assert len(jobs) == CAIRN_JOBS
    ingested = Counter(r.msg_id for j in ids for r in stack.results_for(j))
    assert sorted(ingested.values()) == [1] * CAIRN_JOBS and all(m.endswith(":d1") for m in ingested)
    acked = [CAIRN_ACKED.findall(b.log()) for b in bridges]
    assert all(acked), f"one bridge acked nothing: {[len(a) for a in acked]}"
    seqs = [{int(seq) for seq, delivery in a if delivery == "1"} for a in acked]
    assert not seqs[0] & seqs[1] and len(seqs[0] | seqs[1]) == CAIRN_JOBS  # each message settled by one bridge
    imported = Counter(re.findall(r"fetch_source (\S+) imported", worker.log()))
    assert sorted(imported.values()) == [1] * CAIRN_JOBS  # each job ran once
    assert consumer["num_pending"] == 0 and consumer["num_ack_pending"] == 0


def _line(name: str, env: dict[str, str], tmp_path: Path, n: int = 0) -> Proc:
    """The Procfile's line ``name`` as its ``n``-th process, named as honcho names it (DYNO would mean Heroku)."""
    node = f"{name}.{n + 1}"
    return procfile.run(name, {**env, "HONCHO_PROCESS_NAME": node}, tmp_path / f"{node}.log")


def _logged(proc: Proc, text: str) -> bool:
    return text in proc.log()


def _acked(bridges: list[Proc]) -> list[tuple[str, str]]:
    return [m for b in bridges for m in CAIRN_ACKED.findall(b.log())]
