"""C6: provider pools side by side in one fleet, on one Redis and one NATS, through the Procfile's lines.

Four pools share a Redis, a nats-server with JetStream and the dev core:

* the Strava pool;
* the Garmin pool (credentials logins, FIT originals, the fake Garmin Connect), on the
  Procfile's own ``garmin_bridge`` and ``garmin`` lines, which name it ``garmin-fetcher``;
* a second Strava pool under another name (same provider, same fake Strava, its own
  athletes): only the pool tells the two apart, the case a queue per *provider* would miss;
* the ``filedrop`` pool, another provider shipped as its own distribution (tests/filedrop.py).

Each pool runs the Procfile's own command lines (``cairn_bridge`` and ``provider`` with
the pool's ``CAIRN_PROVIDER`` / ``CAIRN_WORKER_NAME``, or the pool's own lines), and
Flower runs its ``web`` line.
The second Strava pool's worker is started only after every other pool has finished its
jobs: with one queue for every pool, the first Strava worker, idle, would have run them
with its own name; with a queue per pool they wait for their own worker. Then every job
must have run on its own pool — asserted from what the worker that ran it says (the
``worker_name`` stamped on the result from the running worker's settings, the task in
that worker's log, the worker and queue Flower shows) — and each pool's presence,
manifest and consumers must be its own, and no pool may stray outside core's NATS
template for it.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from celery import Celery

from devstack.fakes.garmin.kit import GarminKit
from devstack.fakes.strava.kit import StravaKit
from devstack.infra import procfile
from devstack.infra.cairn_stack import CairnStack, Connected, Pool, ProviderFake
from devstack.infra.procs import Proc
from devstack.infra.services import free_port
from tasks.routes import UnroutedPoolTask, provider_queue, route_cairn
from tests.kit.filedrop import DISTRIBUTION, FileDropKit, install_distribution
from tests.kit.waiting import wait_until
from workers.cairn.contract import subjects
from workers.cairn.handlers.context import JobContext
from workers.cairn.handlers.run import wrong_pool
from workers.cairn.settings import CairnSettings, load_cairn_settings, pool_variable
from workers.errors import ConfigError
from workers.logs import redact
from workers.providers.kinds import FETCH_SOURCE, IMPORT_GEAR, PARSE_BLOB, RECONCILE

pytestmark = pytest.mark.slow  # starts fleet processes (tests/kit/fleet_guard.py)

START_TIMEOUT_S = 90.0  # a loaded box: a prefork worker and a bridge each import the whole fleet
JOBS_TIMEOUT_S = 120.0
JOBS_PER_POOL = 2
HTTP_TIMEOUT_S = 10.0
FLOWER_INSPECT_TIMEOUT_MS = "3000"  # /api/workers?refresh=1 waits this long for the workers' inspect replies
FLOWER_TIMEOUT_S = 60.0  # a refresh runs several inspect calls
HELD_START_S = "600"  # CAIRN_TASK_START_DEADLINE_S: the held pool's tasks wait for their worker, not revoked
FLOWER_USER = "pools"
STRAVA_PACKAGE = "switchyard.providers.strava"  # CAIRN_WORKER_PACKAGE's default for the strava provider
GARMIN_PACKAGE = "switchyard.providers.garmin"  # ... and for the garmin provider


@dataclass(frozen=True)
class PoolSpec:
    """One pool of the fleet: its provider, its Procfile lines, its fake, and what it declares."""

    name: str  # the pool's name (CAIRN_WORKER_NAME), made unique per run unless its lines name it
    provider: str
    fake: Callable[[Path], ProviderFake]  # the provider's fake (given the filedrop site directory)
    package: str  # the worker_package its results and records carry
    kinds: frozenset[str]  # the job subjects its bridge consumes
    bridge_line: str = "cairn_bridge"
    worker_line: str = "provider"
    held: bool = False  # its worker starts only once every other pool is done


POOLS = (
    PoolSpec("strava", "strava", lambda _: StravaKit(), STRAVA_PACKAGE,
             frozenset({FETCH_SOURCE, RECONCILE, PARSE_BLOB, IMPORT_GEAR})),
    PoolSpec("garmin", "garmin", lambda _: GarminKit(), GARMIN_PACKAGE,
             frozenset({FETCH_SOURCE, RECONCILE, PARSE_BLOB}), bridge_line="garmin_bridge", worker_line="garmin"),
    PoolSpec("strava-b", "strava", lambda _: StravaKit(), STRAVA_PACKAGE,
             frozenset({FETCH_SOURCE, RECONCILE, PARSE_BLOB, IMPORT_GEAR}), held=True),
    PoolSpec("filedrop", "filedrop", FileDropKit, DISTRIBUTION, frozenset({FETCH_SOURCE, RECONCILE, PARSE_BLOB})),
)


# --------------------------------------------------------------------------- units
def test_a_cairn_task_without_its_pools_queue_is_refused_by_the_routes() -> None:
    """A Cairn task has no home without its pool: sent without a queue it would land on ``io``."""
    assert route_cairn("cairn.job", [], {}, {"queue": provider_queue("strava-fetcher")}) is None
    assert route_cairn("voicy.download", [], {}, {}) is None
    with pytest.raises(UnroutedPoolTask, match="provider.<worker_name>"):
        route_cairn("cairn.job", [], {}, {})


def test_a_job_of_another_pool_is_handed_back_untouched() -> None:
    """Defence in depth behind the queues: a worker never runs another pool's job with its provider."""
    ctx = JobContext(settings=CairnSettings(worker_name="strava-fetcher"), nats=None, redis=None,
                     provider=None, http=None)  # type: ignore[arg-type]  # wrong_pool reads the name only
    assert wrong_pool(ctx, {"pool": "strava-fetcher"}) is None
    assert wrong_pool(ctx, {}) is None  # a bridge from before pools named themselves
    handed = wrong_pool(ctx, {"pool": "garmin-fetcher"})
    assert handed is not None and handed.action == "nak" and not handed.counts_as_failure


def test_a_pool_reads_its_own_credentials_before_the_fleet_wide_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pools that share one environment (an app's config vars) each log in as themselves: an enrollment
    (and a dev NATS user) is one pool's. ``CAIRN_POOL_<NAME>_*`` wins over ``CAIRN_*``, for that pool only."""
    for key in [k for k in os.environ if k.startswith("CAIRN_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("CAIRN_NATS_USER", "fleet-user")
    monkeypatch.setenv("CAIRN_NATS_PASSWORD", "fleet-SECRET-pw")
    assert pool_variable("garmin-fetcher", "nats_user") == "CAIRN_POOL_GARMIN_FETCHER_NATS_USER"
    monkeypatch.setenv("CAIRN_POOL_GARMIN_FETCHER_NATS_USER", "garmin-user")
    monkeypatch.setenv("CAIRN_POOL_GARMIN_FETCHER_NATS_PASSWORD", "garmin-SECRET-pw")
    monkeypatch.setenv("CAIRN_POOL_GARMIN_FETCHER_WORKER_ENROLLMENT_TOKEN", "garmin-SECRET-token")
    garmin = load_cairn_settings(worker_name="garmin-fetcher", provider="garmin")
    assert garmin.nats_user == "garmin-user" and garmin.nats_password is not None
    assert garmin.nats_password.get_secret_value() == "garmin-SECRET-pw"
    assert garmin.worker_enrollment_token is not None
    assert "garmin-SECRET-token" not in redact("token garmin-SECRET-token")  # a secret, as the fleet-wide ones
    strava = load_cairn_settings(worker_name="strava-fetcher")
    assert strava.nats_user == "fleet-user" and strava.worker_enrollment_token is None
    monkeypatch.delenv("CAIRN_NATS_USER")
    monkeypatch.delenv("CAIRN_POOL_GARMIN_FETCHER_NATS_USER")
    with pytest.raises(ConfigError, match="CAIRN_NATS_PASSWORD needs CAIRN_NATS_USER"):
        load_cairn_settings(worker_name="garmin-fetcher")  # its own password still needs a user


# --------------------------------------------------------------------------- the fleet
@dataclass
class RunningPool:
    spec: PoolSpec
    pool: Pool
    env: dict[str, str]
    bridge: Proc | None = None
    worker: Proc | None = None
    accounts: tuple[Connected, ...] = ()
    jobs: tuple[dict[str, Any], ...] = ()

    @property
    def node(self) -> str:
        return f"{self.pool.worker_name}.1@{socket.gethostname()}"  # -n ${DYNO}@%h

    @property
    def queue(self) -> str:
        return provider_queue(self.pool.worker_name)


class Fleet:
    """The stack and the Procfile processes of every pool; stopped in reverse."""

    def __init__(self, tmp: Path, redis_url: str, s3_endpoint: str, specs: tuple[PoolSpec, ...]) -> None:
        self.tmp, self.run = tmp, uuid.uuid4().hex[:6]
        site = install_distribution(tmp / "site-packages")
        fakes: dict[str, ProviderFake] = {}
        for spec in specs:
            fakes.setdefault(spec.provider, spec.fake(site))
        redis.Redis.from_url(redis_url).flushall()
        self.stack = CairnStack(tmp / "stack", redis_url=redis_url, s3_endpoint=s3_endpoint,
                                fakes=list(fakes.values()), name=f"pools-{self.run}").start()
        self.pools = [RunningPool(spec, pool := Pool(spec.provider, self.pool_name(spec)),
                                  self.stack.env(pool, DYNO=f"{pool.worker_name}.1", PROVIDER_CONCURRENCY="1",
                                                 GARMIN_CONCURRENCY="1", LOG_LEVEL="INFO",
                                                 CAIRN_TASK_START_DEADLINE_S=HELD_START_S))
                      for spec in specs]
        self.procs: list[Proc] = []
        self.flower_port, self.flower_password = free_port(), f"pw-{uuid.uuid4().hex}"

    def pool_name(self, spec: PoolSpec) -> str:
        """The pool's name: the one its own Procfile lines set (both the same, and the provider theirs),
        else the spec's, unique per run."""
        lines = procfile.entries()
        bridge, worker = lines[spec.bridge_line], lines[spec.worker_line]
        named = procfile.pool_of(bridge)
        assert named == procfile.pool_of(worker), (spec.bridge_line, spec.worker_line)
        assert procfile.provider_of(bridge) in (None, spec.provider) and procfile.provider_of(worker) in (
            None, spec.provider), spec
        return named or f"{spec.name}-{self.run}"

    def launch(self, line: str, env: dict[str, str], log: str, ready: str) -> Proc:
        proc = procfile.run(line, env, self.tmp / f"{log}.log")
        self.procs.append(proc)
        wait_until(lambda: ready in proc.log() or proc.proc.poll() is not None, START_TIMEOUT_S, f"{log}: {ready}")
        assert proc.proc.poll() is None, proc.log()[-3000:]
        return proc

    def start_flower(self) -> None:
        env = {**self.stack.env(self.pools[0].pool), "PORT": str(self.flower_port), "FLOWER_ADDRESS": "127.0.0.1",
               "FLOWER_USER": FLOWER_USER, "FLOWER_PASSWORD": self.flower_password,
               "FLOWER_INSPECT_TIMEOUT": FLOWER_INSPECT_TIMEOUT_MS}
        self.launch("web", env, "web", "Visit me at")

    def start_bridge(self, rp: RunningPool) -> None:
        rp.bridge = self.launch(rp.spec.bridge_line, rp.env, f"{rp.pool.worker_name}-bridge", "cairn bridge started")

    def start_worker(self, rp: RunningPool) -> None:
        rp.worker = self.launch(rp.spec.worker_line, rp.env, f"{rp.pool.worker_name}-worker", " ready.")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.stack.stop()

    def flower(self, path: str) -> Any:
        response = httpx.get(f"http://127.0.0.1:{self.flower_port}{path}", auth=(FLOWER_USER, self.flower_password),
                             timeout=FLOWER_TIMEOUT_S)
        response.raise_for_status()
        return response.json()


@pytest.fixture()
def fleet(tmp_path: Path, redis_url: str, s3_endpoint: str) -> Iterator[Fleet]:
    f = Fleet(tmp_path, redis_url, s3_endpoint, POOLS)
    try:
        yield f
    finally:
        f.stop()


def _results(fleet: Fleet, rp: RunningPool) -> dict[str, Any]:
    """The activity result core accepted for each of the pool's jobs, by job id."""
    return {job["job_id"]: found[0] for job in rp.jobs if (found := fleet.stack.results_for(job["job_id"]))}


def test_pools_share_one_redis_and_one_nats_yet_each_job_runs_on_its_own_pool(fleet: Fleet) -> None:
    core = fleet.stack.core
    assert core is not None
    r = redis.Redis.from_url(fleet.stack.redis_url or "")
    fleet.start_flower()
    for rp in fleet.pools:
        fleet.start_bridge(rp)
    for rp in fleet.pools:
        if not rp.spec.held:
            fleet.start_worker(rp)
    for rp in fleet.pools:
        rp.accounts = (fleet.stack.connect(rp.pool, JOBS_PER_POOL),)
        rp.jobs = tuple(fleet.stack.fetch_jobs(rp.accounts))
        for job in rp.jobs:
            core.enqueue_job(FETCH_SOURCE, job)

    running = [rp for rp in fleet.pools if not rp.spec.held]
    held = [rp for rp in fleet.pools if rp.spec.held]
    wait_until(lambda: all(len(_results(fleet, rp)) == len(rp.jobs) for rp in running), JOBS_TIMEOUT_S,
               "every job of the pools with a worker")
    for rp in held:  # idle workers of other pools did not take them: they wait in the pool's own queue
        def holding(rp: RunningPool = rp) -> bool:
            return r.llen(rp.queue) == len(rp.jobs)

        wait_until(holding, JOBS_TIMEOUT_S, f"{rp.queue} holding its jobs")
        assert not _results(fleet, rp)
    for rp in held:
        fleet.start_worker(rp)
    wait_until(lambda: all(len(_results(fleet, rp)) == len(rp.jobs) for rp in fleet.pools), JOBS_TIMEOUT_S,
               "every job of every pool")

    for rp in fleet.pools:
        _assert_ran_on_its_own_pool(fleet, rp)
        _assert_records_are_its_own(fleet, rp)
    _assert_flower_shows_the_pools_apart(fleet)
    assert fleet.stack.nats_auth.violations() == []  # no pool strayed outside its own template
    r.close()


def _assert_ran_on_its_own_pool(fleet: Fleet, rp: RunningPool) -> None:
    """The worker that ran each job stamped the result with its own pool's name and package, its
    provider mapped it, and the task is in that worker's log and no other pool's."""
    name = rp.pool.worker_name
    for job_id, result in _results(fleet, rp).items():
        data = result.data
        assert (data["workerName"], data["workerPackage"]) == (name, rp.spec.package), (job_id, data)
        assert result.pool == name and result.provider == rp.pool.provider
        (event,) = [e for e in data["events"] if "activity" in e]
        assert event["activity"]["ref"]["provider"] == rp.pool.provider
    assert rp.worker is not None
    ran = set(re.findall(r"Task cairn\.job\[(cairn-[\w-]+?-\d+-d\d+-[0-9a-f]+)\] succeeded", rp.worker.log()))
    assert len(ran) == len(rp.jobs) and all(t.startswith(f"cairn-{name}-") for t in ran), ran
    for other in fleet.pools:
        if other is not rp and other.worker is not None:
            assert f"cairn-{name}-" not in other.worker.log(), f"{other.pool.worker_name} ran a task of {name}"


def _assert_records_are_its_own(fleet: Fleet, rp: RunningPool) -> None:
    """Presence, manifest and consumers: the pool's own, under its name, with its provider."""
    core = fleet.stack.core
    assert core is not None
    name, provider = rp.pool.worker_name, rp.pool.provider
    presence = core.live_presence(name)
    assert len(presence) == 1, presence  # its one worker instance, nobody else's
    ((key, record),) = presence.items()
    assert key.startswith(f"{name}.") and record["worker_name"] == name and record["provider"] == provider
    assert record["worker_key"] == rp.pool.key and record["package"] == rp.spec.package
    manifest = core.manifests()[name]
    assert (manifest["worker_name"], manifest["provider"], manifest["package"]) == (name, provider, rp.spec.package)
    mine = {c["durable_name"]: c["filter_subject"] for c in core.consumers()
            if c["durable_name"].startswith(f"{name}_")}
    assert mine == {f"{name}_{kind}": subjects.job_subject(kind, provider, name) for kind in rp.spec.kinds}, mine
    # Each pool's bridge and workers hold its own NATS identity, core's template for that pool alone.
    auth = fleet.stack.nats_auth
    users = {c.get("authorized_user") for c in auth.connections() if c.get("name") == name}
    assert users == {auth.login(rp.pool).user}, users
    probe = Celery(broker=fleet.stack.redis_url)
    try:
        queues = probe.control.inspect(destination=[rp.node], timeout=HTTP_TIMEOUT_S).active_queues() or {}
    finally:
        probe.close()
    assert {q["name"] for q in queues[rp.node]} == {rp.queue}


def _assert_flower_shows_the_pools_apart(fleet: Fleet) -> None:
    """Flower's task list: each job's task ran on its pool's worker, routed by its pool's queue."""
    nodes = {rp.node: rp for rp in fleet.pools}
    expected = {job["job_id"]: rp for rp in fleet.pools for job in rp.jobs}

    def every_job() -> dict[str, Any] | None:
        listed = fleet.flower("/api/tasks?taskname=cairn.job")
        found = {job_id: t for t in listed.values() if t.get("state") == "SUCCESS"
                 for job_id in expected if job_id in str(t.get("args"))}
        return found if len(found) == len(expected) else None

    tasks = wait_until(every_job, JOBS_TIMEOUT_S, "Flower to list every job's task", interval_s=0.5)
    for job_id, task in tasks.items():
        rp = expected[job_id]
        assert nodes.get(task["worker"]) is rp, (job_id, task["worker"], rp.node)
        assert task["routing_key"] == rp.queue, (job_id, task["routing_key"])
    workers = fleet.flower("/api/workers?refresh=1")
    for rp in fleet.pools:
        assert {q["name"] for q in workers[rp.node]["active_queues"]} == {rp.queue}
