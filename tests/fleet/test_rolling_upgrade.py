"""D1, rolling upgrades: the previous release (CHANGELOG.md) runs beside this one, both ways, on one Redis and one NATS.

The previous release's tree comes from this clone's own history (``git archive`` of
the commit its changelog entry names) and its processes run on the same interpreter
with that tree first on ``sys.path`` (``tests/kit/release_probe.py`` says where each
process's code loaded from; the previous release's declared dependencies must be met
by this environment, or the test says it needs a virtualenv of its own).

* Cairn: two pools of one provider, each a bridge of one release with a worker of the
  other (``new→old`` and ``old→new``), running at once.
* Voicy: a bridge, ``io`` and ``gpu`` worker of alternating releases, so every task
  crosses releases: this release's bridge feeds the previous release's ``io`` worker,
  which feeds this release's ``gpu`` worker; then the reverse.
* A task of a shape this release cannot read (a later release's) is refused with one
  line and handed back by the contract's own redelivery: the Voicy job fails retryably
  and completes once afterwards; the Cairn job gets a NAK that is not a failure.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from devstack.infra import log_budget, services
from devstack.infra.cairn_stack import CairnStack, Connected, Pool
from devstack.infra.log_budget import Allow
from devstack.infra.procs import Proc
from tasks.routes import QUEUE_GPU, provider_queue
from tasks.shapes import SHAPE_KEY
from tests.kit.cairn_stack import BRIDGE_STOP_TIMEOUT_S
from tests.kit.cairn_stack import TEST_ENV as CAIRN_TEST_ENV
from tests.kit.celery_worker import CeleryWorker
from tests.kit.releases import ReleaseWorker, checkout, command, previous_release, spawn_from, unmet_requirements
from tests.kit.voicy_stack import (
    assert_completed_once,
    claim_without_sending,
    enqueue_fixture,
    fleet_runtime,
    requests_for,
    short_item,
    voicy_dev_stack,
    wait_final,
)
from tests.kit.waiting import wait_until
from workers.cairn.disposition import RELEASE_REFUSED_NAK_DELAY_S
from workers.voicy.fleet import HELD_KEY
from workers.voicy.pipeline import confirm_grant

pytestmark = [pytest.mark.slow, pytest.mark.model]  # fleet processes; the gpu workers load tiny.en

ROOT = Path(__file__).resolve().parents[2]
PROVIDER = "strava"
FUTURE_SHAPE = 2  # a shape no release reads yet: what a later release's sender might write
READY_TIMEOUT_S = 90.0  # a loaded box: seven processes import the fleet at once
WAIT_S = 60.0
LOG_BUDGET_ALLOW = [
    Allow(r"failed \(retryable=True\): voicy\.transcribe: argument shape 2 is not one this release reads",
          logs=("gpu-new",), reason="a later release's voicy.transcribe is refused and its job handed back to Voicy",
          provoked_by="module"),
    Allow(r"cairn job refused: cairn\.job: argument shape 2 is not one this release reads", logs=("provider-new",),
          reason="a later release's cairn.job is refused with a NAK that is not a failure", provoked_by="module"),
]


@dataclass
class Fleet:
    """One Redis, one NATS (dev core, fake Strava), the dev Voicy API, and the processes of both releases."""

    tmp: Path
    previous: Path  # the previous release's tree
    redis_url: str
    cairn: CairnStack
    voicy: tuple[Any, Any, dict[str, str]]  # server, telegram, env
    procs: list[Proc | CeleryWorker] = field(default_factory=list)

    def tree(self, release: str) -> Path:
        return ROOT if release == "new" else self.previous

    def start_worker(self, release: str, queue: str, env: dict[str, str], label: str) -> CeleryWorker:
        name = f"{label}-{release}-{uuid.uuid4().hex[:4]}@upgrade"
        worker = ReleaseWorker(self.tree(release), queue, env, self.tmp / f"{label}-{release}.log", name=name)
        self.procs.append(worker)
        return worker

    def start_bridge(self, release: str, side: str, env: dict[str, str], label: str) -> Proc:
        tree = self.tree(release)
        proc = spawn_from(tree, command(tree, "bridges", side), env, self.tmp / f"{label}-{release}.log",
                          stop_timeout_s=BRIDGE_STOP_TIMEOUT_S)
        self.procs.append(proc)
        return proc

    def stop(self, *procs: Proc | CeleryWorker) -> None:
        """Stop ``procs`` (default: all) at once, as a deploy stops a release's processes."""
        with ThreadPoolExecutor(max_workers=len(self.procs) or 1) as pool:
            list(pool.map(lambda proc: proc.stop(), procs or self.procs))

    def start_voicy(self, bridge: str, io: str, gpu: str) -> list[Proc | CeleryWorker]:
        """A Voicy bridge, ``io`` and ``gpu`` worker of the given releases, started together, each ready."""
        env = self.voicy[2]
        io_worker = self.start_worker(io, "io", env, "io")
        gpu_worker = self.start_worker(gpu, QUEUE_GPU, env, "gpu")
        voicy_bridge = self.start_bridge(bridge, "voicy", env, "voicy-bridge")
        io_worker.wait_ready(self.redis_url)
        gpu_worker.wait_ready(self.redis_url)
        _bridge_ready(voicy_bridge, "voicy bridge started")
        return [voicy_bridge, io_worker, gpu_worker]


@dataclass
class CairnPair:
    """A pool whose bridge runs one release and whose worker the other."""

    pool: Pool
    bridge: Proc
    worker: CeleryWorker
    account: Connected
    redis_url: str

    def wait_ready(self) -> None:
        self.worker.wait_ready(self.redis_url)
        _bridge_ready(self.bridge, "cairn bridge started")


def _bridge_ready(proc: Proc, line: str) -> None:
    wait_until(lambda: line in proc.log() or proc.proc.poll() is not None, READY_TIMEOUT_S, f"{proc.name}: {line}")
    assert proc.proc.poll() is None, proc.log()[-3000:]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("rolling-upgrade")
    release = previous_release()
    previous = checkout(release, tmp / f"release-{release.version}")
    unmet = unmet_requirements(previous)
    assert not unmet, f"release {release.version} needs a virtualenv of its own: {unmet}"
    redis_svc = services.start_redis(tmp / "redis")
    cairn = CairnStack(tmp / "cairn", redis_url=redis_svc.url, s3_endpoint=s3_endpoint).start()
    try:
        with voicy_dev_stack(tmp, redis_svc.url, "upgrade") as voicy:
            world = Fleet(tmp, previous, redis_svc.url, cairn, voicy)
            try:
                yield world
            finally:
                world.stop()
    finally:
        cairn.stop()
        redis_svc.stop()
    _assert_each_process_ran_its_own_release(tmp, previous)
    log_budget.check([tmp], [*log_budget.baseline(), *LOG_BUDGET_ALLOW])


@pytest.fixture(scope="module")
def cairn_pairs(fleet: Fleet) -> dict[str, CairnPair]:
    """Both Cairn pools, started together (each test waits for the one it uses): ``new-bridge`` (this
    release's bridge, the previous release's worker) and ``old-bridge`` (the reverse)."""
    pairs: dict[str, CairnPair] = {}
    for bridge_release, worker_release in (("new", "old"), ("old", "new")):
        label = f"{bridge_release}-bridge"
        pool = fleet.cairn.pool(PROVIDER, f"upgrade-{label}-{uuid.uuid4().hex[:4]}")
        env = fleet.cairn.env(pool, **CAIRN_TEST_ENV, LOG_LEVEL="INFO")
        worker = fleet.start_worker(worker_release, provider_queue(pool.worker_name), env, "provider")
        bridge = fleet.start_bridge(bridge_release, "cairn", env, f"cairn-bridge-{label}")
        pairs[label] = CairnPair(pool, bridge, worker, fleet.cairn.connect(pool, n_activities=1), fleet.redis_url)
    return pairs


def _run_cairn_job(fleet: Fleet, pair: CairnPair) -> None:
    """One fetch_source through the pair: ingested once, acked, never failed."""
    pair.wait_ready()
    job = fleet.cairn.fetch_job(pair.account, pair.account.ext_ids[0])
    core = fleet.cairn.core
    assert core is not None
    core.enqueue_job("fetch_source", job)
    core.router.wait(lambda: bool(_results(fleet, job)), WAIT_S, f"{pair.pool.worker_name}'s result")
    (result,) = _results(fleet, job)
    assert result.msg_id == f"result:{job['job_id']}:d1"  # the first delivery: nothing was handed back
    assert result.data.get("workerName") == pair.pool.worker_name
    wait_until(lambda: fleet.cairn.consumer(pair.pool, "fetch_source")["num_ack_pending"] == 0, WAIT_S,
               "the bridge's ack")
    assert not [r for r in core.ingested if r.kind == "failure"]


def _results(fleet: Fleet, job: dict[str, Any]) -> list[Any]:
    return fleet.cairn.results_for(job["job_id"])


def test_this_releases_bridges_feed_the_previous_releases_workers(
        fleet: Fleet, cairn_pairs: dict[str, CairnPair], monkeypatch: pytest.MonkeyPatch) -> None:
    """new bridge → old ``io`` → new ``gpu``, and a later release's task refused on the way; Cairn new → old."""
    server, telegram, env = fleet.voicy
    job_id = enqueue_fixture(server, telegram, short_item())
    # A later release's transcription task for a job claimed here reaches this release's gpu worker: refused
    # and handed back to Voicy, which requeues the job; this release's bridge claims it again and the previous
    # release's io worker downloads it for this release's gpu worker. Sent as the bridge sends (then the
    # grant confirmed), before any Voicy process starts: the bridge cannot claim the job first.
    with fleet_runtime(env, monkeypatch) as rt:
        claimed, token = claim_without_sending(rt)
        assert claimed == job_id
        probe = Celery(broker=fleet.redis_url, backend=fleet.redis_url)
        try:
            probe.send_task("voicy.transcribe", args=[job_id, token], kwargs={SHAPE_KEY: FUTURE_SHAPE},
                            queue=QUEUE_GPU)
        finally:
            probe.close()
        assert confirm_grant(rt, job_id, token)
    voicy = fleet.start_voicy(bridge="new", io="old", gpu="new")
    _run_cairn_job(fleet, cairn_pairs["new-bridge"])
    wait_final(server, [job_id], WAIT_S)
    assert_completed_once(server, job_id)
    assert server.get_job(job_id)["attempts"] == 2  # the refused attempt, then the one that completed
    (failure,) = requests_for(server, job_id, "failure")
    assert failure["status"] == 200 and failure["json"]["retryable"] is True
    assert "argument shape 2 is not one this release reads" in failure["json"]["error"]
    _assert_nothing_held(fleet)
    fleet.stop(*voicy)


def test_the_previous_releases_bridges_feed_this_releases_workers(
        fleet: Fleet, cairn_pairs: dict[str, CairnPair]) -> None:
    """old bridge → new ``io`` → old ``gpu``; Cairn old → new, and a later release's ``cairn.job`` refused."""
    server, telegram, env = fleet.voicy
    job_id = enqueue_fixture(server, telegram, short_item(), file_id=f"fid-{uuid.uuid4().hex[:6]}")
    voicy = fleet.start_voicy(bridge="old", io="new", gpu="old")
    pair = cairn_pairs["old-bridge"]
    _run_cairn_job(fleet, pair)
    probe = Celery(broker=fleet.redis_url, backend=fleet.redis_url)
    try:
        meta = {SHAPE_KEY: FUTURE_SHAPE, "seq": 1, "delivery": 1, "lease_token": "t", "pool": pair.pool.worker_name}
        queue = provider_queue(pair.pool.worker_name)
        disposition = probe.send_task("cairn.job", args=["fetch_source", {}, meta], queue=queue).get(timeout=WAIT_S)
    finally:
        probe.close()
    assert disposition["action"] == "nak" and disposition["counts_as_failure"] is False
    assert disposition["delay_s"] == RELEASE_REFUSED_NAK_DELAY_S
    wait_final(server, [job_id], WAIT_S)
    assert_completed_once(server, job_id)
    assert not requests_for(server, job_id, "failure")
    _assert_nothing_held(fleet)
    fleet.stop(*voicy)


def _assert_nothing_held(fleet: Fleet) -> None:
    """The fleet's records of every Voicy job are gone once it ended (forgotten just after the result)."""
    client = redis.Redis.from_url(fleet.redis_url)
    try:
        wait_until(lambda: client.zcard(HELD_KEY) == 0, WAIT_S, "the fleet to forget its ended jobs")
    finally:
        client.close()


def _assert_each_process_ran_its_own_release(tmp: Path, previous: Path) -> None:
    """Every process said it ran from its release's tree, and loaded nothing from another."""
    logs = sorted(tmp.glob("*-new.log")) + sorted(tmp.glob("*-old.log"))
    assert len(logs) == 10, [p.name for p in logs]  # 2 Cairn pairs, 2 Voicy fleets of three
    for path in logs:
        text = path.read_text(errors="replace")
        tree = ROOT if path.stem.endswith("-new") else previous
        assert "release-probe: pid" in text and f"from {tree.resolve()}: tasks={tree.resolve()}/tasks/" in text, \
            (path.name, text[:500])
        assert "loaded modules of another tree" not in text, (path.name, text[-2000:])
        assert f"project modules, all from {tree.resolve()}" in text, (path.name, text[-1000:])
