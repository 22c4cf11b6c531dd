"""``switchyard health`` against a running Procfile fleet (H1): healthy, and each part's FAIL when provoked.

The fleet is the Procfile's own command lines (every process type but Flower),
with every feature the demo runs switched on (webhooks with a verify token),
against the dev stack: Redis and nats-server of this module, the dev Cairn core
and Voicy API, fake Strava and Telegram. Each provocation test breaks one thing
(stops beat, stops the Voicy bridge or the io worker, SIGKILLs the provider
worker, deletes a durable, records a permanent fault), sees the verdict name
that part, puts it back and waits for a healthy verdict again.

Presence is renewed every ``PRESENCE_INTERVAL_S`` here and the verdict counts a
record live for ``PRESENCE_LIVE_S`` (core's 45 s, shortened through
``CAIRN_PRESENCE_LIVE_S``), so a killed provider worker fails presence within
seconds. The module ends with the log budget: every process's log, read after
the fleet stopped, holds no WARNING, ERROR or traceback but the ones the
provocations below explain.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest
import redis

from bridges.cairn.consumers import ensure_consumers
from devstack.fakes.cairn_core import DevCairnCore
from devstack.fakes.strava import FakeStrava
from devstack.fakes.telegram import FakeTelegram
from devstack.fakes.voicy_api import DevVoicyServer
from devstack.infra import log_budget, services
from devstack.infra.log_budget import Allow
from devstack.infra.nats_auth import Pool
from devstack.infra.procfile import SHELL
from devstack.infra.procfile import entries as procfile_entries
from devstack.infra.procs import Proc, spawn
from devstack.infra.stack import BOT_TOKEN, ROOT, TINY_MODEL_DIR
from ops import health
from ops.doctor import Check
from workers import faults, liveness
from workers.cairn.settings import DEFAULT_ACK_WAIT_S, DEFAULT_MAX_DELIVER, load_cairn_settings

# one xdist worker runs the module, so its module-scoped fleet is started once (not once per worker)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("health")]

FLEET = ("voicy_bridge", "cairn_bridge", "gpu", "io", "provider", "beat")  # the Procfile but Flower
COMMON_PARTS = {"redis", "beat lock", "pool gpu", "pool io", "voicy bridge", "faults"}
POOL_PARTS = ("pool provider.{pool}", "cairn presence {pool}", "cairn manifest {pool}", "nats {pool}",
              "cairn consumers {pool}")  # one each per Cairn pool
PRESENCE_INTERVAL_S = 1.0
# A worker notes its presence writes in its liveness record, renewed every RENEW_INTERVAL_S (5 s): the
# verdict sees a write up to that much later, so "live" must outlast a renewal and a presence interval.
PRESENCE_LIVE_S = liveness.RENEW_INTERVAL_S + PRESENCE_INTERVAL_S + 2.0
CHECK_TIMEOUT_S = 5.0
READY_S = 120.0
POLL_S = 0.5
VERB_TIMEOUT_S = 120.0
PROC_STOP_S = 30.0
CLEAN_ENV_PREFIXES = ("VOICY_", "CAIRN_", "AWS_", "REDIS_", "DYNO", "HONCHO_")

ALLOW = (
    *log_budget.baseline(),  # a stop, a kill, a recorded fault: each provocation but one logs nothing
    Allow(r"NATS (unavailable \(fetch on cairn\.jobs\.fetch_source\.|available again after)", logs=("cairn_bridge",),
          reason="the durable is deleted under the running bridge: its fetches fail until the test makes it again",
          provoked_by="test_a_deleted_consumer_fails_until_the_bridge_binds_it_again"),
)


@dataclass
class Fleet:
    """The running fleet: one dyno per Procfile type, its environment, and the services it uses."""

    tmp: Path
    env: dict[str, str]
    redis_url: str
    nats: services.Service
    pool: str
    procs: dict[str, Proc] = field(default_factory=dict)

    def start(self, kind: str) -> Proc:
        command = procfile_entries()[kind]
        self.procs[kind] = spawn([SHELL, "-c", command], {**self.env, "HONCHO_PROCESS_NAME": f"{kind}.1"},
                                 self.tmp / f"{kind}.log", stop_timeout_s=PROC_STOP_S)
        return self.procs[kind]

    def stop(self, kind: str) -> None:
        self.procs[kind].stop()

    def kill(self, kind: str) -> None:
        proc = self.procs[kind].proc
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(PROC_STOP_S)

    def part(self, name: str) -> str:
        """A Cairn part's name for this fleet's pool (``cairn presence`` → ``cairn presence <pool>``)."""
        return f"pool provider.{self.pool}" if name == "pool provider" else f"{name} {self.pool}"

    def health_env(self, **overrides: str) -> dict[str, str]:
        return {**self.env, "CAIRN_PRESENCE_LIVE_S": str(PRESENCE_LIVE_S), **overrides}

    def logs(self) -> str:
        return "\n".join(f"--- {k}\n{p.log()[-2500:]}" for k, p in self.procs.items())


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(CLEAN_ENV_PREFIXES) and k != "TOKEN"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("health")
    pool = f"health-{uuid.uuid4().hex[:6]}"
    redis_svc = services.start_redis(tmp / "redis")
    pool_ref = Pool("strava", pool)
    nats_svc = services.start_nats(tmp / "nats", pools=[pool_ref])  # core's worker template for the pool
    auth = services.nats_auth_of(nats_svc)
    core = DevCairnCore(nats_svc.url, s3_endpoint, bucket=f"cairn-{pool}",
                        nats_login=auth.core.connect_options()).start()
    strava, voicy, telegram = FakeStrava().start(), DevVoicyServer().start(), FakeTelegram(BOT_TOKEN).start()
    env = clean_env() | {
        "REDIS_URL": redis_svc.url, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "VOICY_WORKER_API_URL": voicy.url, "VOICY_WORKER_TOKEN": voicy.create_client(f"switchyard-{pool}"),
        "VOICY_WORKER_TELEGRAM_API_URL": telegram.url, "VOICY_WORKER_TELEGRAM_BOT_TOKEN": BOT_TOKEN,
        "VOICY_WORKER_MODEL": TINY_MODEL_DIR, "VOICY_WORKER_DEVICE": "cpu",
        "VOICY_WORKER_WORK_DIR": str(tmp / "media"), "VOICY_WORKER_POLL_INTERVAL_MS": "500",
        "CAIRN_NATS_URL": nats_svc.url, "CAIRN_PROVIDER": "strava", "CAIRN_WORKER_NAME": pool,
        "CAIRN_STRAVA_BASE_URL": strava.base_url, "CAIRN_PRESENCE_INTERVAL_S": str(PRESENCE_INTERVAL_S),
        "CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN": f"verify-{uuid.uuid4().hex}",
        "IO_CONCURRENCY": "1", "PROVIDER_CONCURRENCY": "1",
        **auth.login(pool_ref).env(),  # the fleet, and the verdict, log in as the pool's worker
    }
    running = Fleet(tmp, env, redis_svc.url, nats_svc, pool)
    try:
        for kind in FLEET:
            running.start(kind)
        yield running
    finally:
        for proc in running.procs.values():
            proc.stop()
        violations = auth.violations()  # the verdict, like the pool, stays within core's worker template
        for svc in (telegram, voicy, strava, core):
            svc.stop()
        nats_svc.stop()
        redis_svc.stop()
    assert not violations, violations
    log_budget.check([p.log_path for p in running.procs.values()], ALLOW)


# --- asking for the verdict ---------------------------------------------------------------------------
def verdict(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Check]:
    """The verdict in this process, under the fleet's environment (what the verb prints, as data)."""
    with monkeypatch.context() as patched:
        for key in [k for k in os.environ if k.startswith(CLEAN_ENV_PREFIXES)]:
            patched.delenv(key)
        for key, value in env.items():
            if key.startswith(CLEAN_ENV_PREFIXES):
                patched.setenv(key, value)
        return {check.name: check for check in health.verdict(CHECK_TIMEOUT_S)}


def failing(checks: dict[str, Check]) -> dict[str, str]:
    return {name: check.detail for name, check in checks.items() if check.failed}


def wait_for(fleet: Fleet, monkeypatch: pytest.MonkeyPatch, want: str, timeout_s: float = READY_S,
             because: str = "", **env: str) -> dict[str, Check]:
    """Ask until the verdict is healthy (``want=""``) or fails ``want`` with ``because`` in its detail:
    the fleet's records change in other processes, so there is no event to await here."""
    deadline = time.monotonic() + timeout_s
    checks: dict[str, Check] = {}
    while time.monotonic() < deadline:
        checks = verdict(fleet.health_env(**env), monkeypatch)
        bad = failing(checks)
        if (want in bad and because in bad[want]) if want else not bad:
            return checks
        time.sleep(POLL_S)
    raise AssertionError(f"no verdict {f'failing {want} ({because})' if want else 'healthy'} within {timeout_s}s: "
                         f"{failing(checks)}\n{fleet.logs()}")


def run_verb(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ops", "health", "--timeout", str(CHECK_TIMEOUT_S), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=VERB_TIMEOUT_S)


# --- healthy --------------------------------------------------------------------------------------------
def test_the_verb_reports_the_procfile_fleet_healthy(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    wait_for(fleet, monkeypatch, "")
    run = run_verb(fleet.health_env())
    lines = run.stdout.splitlines()
    assert run.returncode == 0, run.stdout + run.stderr
    parts = {line.split(":", 1)[0].split(None, 1)[1] for line in lines[:-1]}
    expected = COMMON_PARTS | {name.format(pool=fleet.pool) for name in POOL_PARTS}
    assert parts == expected, lines
    assert all(line.startswith("ok ") for line in lines[:-1]), lines
    assert lines[-1] == f"HEALTHY: {len(expected)} parts checked"
    presence = next(line for line in lines if "cairn presence" in line)
    assert "1 live instance(s), webhooks=true" in presence  # the verify token is set: webhooks on


# --- each part, provoked ------------------------------------------------------------------------------
def test_a_recorded_fault_is_named_until_it_is_cleared(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    wait_for(fleet, monkeypatch, "")
    client = redis.Redis.from_url(fleet.redis_url)
    detail = 'NATS refused publish to "cairn.events.source.deleted_upstream" (Permissions Violation)'
    component = f"cairn-bridge/{fleet.pool}"
    faults.record_fault(client, component, detail)
    try:
        run = run_verb(fleet.health_env())
        assert run.returncode == 1, run.stdout
        assert run.stdout.splitlines()[-1] == "UNHEALTHY: faults"
        assert f"FAIL faults: {component}: {detail} (since " in run.stdout
        cleared = run_verb(fleet.health_env(), "--clear-faults")
        assert cleared.returncode == 0, cleared.stdout
        assert faults.read_faults(client) == []
    finally:
        faults.clear_fault(client, component)
        client.close()


@pytest.mark.parametrize(("kind", "part", "why"), [
    ("beat", "beat lock", "no beat holds the RedBeat lock redbeat::lock"),  # a clean stop releases the lock
    ("voicy_bridge", "voicy bridge", "no Voicy bridge is polling"),  # a stopping bridge deletes its record
    ("io", "pool io", "no Celery worker consumes queue io"),  # a worker deletes its record as it stops
], ids=["beat", "voicy-bridge", "io-worker"])
def test_a_stopped_process_fails_its_part_at_once(fleet: Fleet, monkeypatch: pytest.MonkeyPatch, kind: str,
                                                  part: str, why: str) -> None:
    wait_for(fleet, monkeypatch, "")
    fleet.stop(kind)
    try:
        checks = verdict(fleet.health_env(), monkeypatch)
        assert failing(checks).keys() == {part}, failing(checks)
        assert why in checks[part].detail
    finally:
        fleet.start(kind)
    wait_for(fleet, monkeypatch, "")


def test_a_killed_provider_worker_fails_presence_after_the_cutoff(fleet: Fleet,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    wait_for(fleet, monkeypatch, "")
    fleet.kill("provider")
    killed = time.monotonic()
    try:
        checks = wait_for(fleet, monkeypatch, fleet.part("cairn presence"), timeout_s=PRESENCE_LIVE_S * 4,
                          because=f"no live presence for pool {fleet.pool}")
        # not at once: its last write counts until the cutoff (seen up to a renewal and an interval late)
        assert time.monotonic() - killed >= PRESENCE_LIVE_S - liveness.RENEW_INTERVAL_S - PRESENCE_INTERVAL_S
        assert f"no live presence for pool {fleet.pool}" in checks[fleet.part("cairn presence")].detail
    finally:
        fleet.start("provider")
    wait_for(fleet, monkeypatch, "")


def test_presence_with_the_wrong_webhooks_flag_fails(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's bridge serves the webhook durable; an instance of the pool that reports webhooks=false
    (started without the verify token) fails presence, judged by the fleet's records alone."""
    wait_for(fleet, monkeypatch, "")
    client = redis.Redis.from_url(fleet.redis_url)
    odd = liveness.ProcessRecord(role=liveness.WORKER, name="provider.9@odd", queues=[f"provider.{fleet.pool}"],
                                 pool=fleet.pool, provider="strava", cairn_instance="provider-9-odd",
                                 presence_at=time.time(), presence_webhooks=False, manifest_at=time.time())
    liveness.renew(client, odd)
    try:
        checks = verdict(fleet.health_env(), monkeypatch)
        assert failing(checks).keys() == {fleet.part("cairn presence")}, failing(checks)
        detail = checks[fleet.part("cairn presence")].detail
        assert f"provider.9@odd report webhooks=false but the pool's bridge serves {fleet.pool}__webhook_event" \
            in detail, detail
    finally:
        liveness.forget(client, liveness.WORKER, odd.name)
        client.close()


def test_the_askers_own_webhook_settings_do_not_matter(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator's shell without the pool's verify token still sees the fleet healthy: what the pool
    runs comes from its records, not from the environment the verdict is asked from."""
    wait_for(fleet, monkeypatch, "")
    run = run_verb(fleet.health_env(CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN=""))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "webhooks=true" in next(line for line in run.stdout.splitlines() if "cairn presence" in line)


def test_with_only_redis_url_the_verdict_names_what_it_could_not_check(fleet: Fleet,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail closed: given only REDIS_URL, every part the records show is listed; the Voicy and pool parts
    are checked from Redis, the pool's NATS parts cannot be, and the verdict says so and exits 1."""
    wait_for(fleet, monkeypatch, "")
    only_redis = {k: v for k, v in fleet.health_env().items() if not k.startswith(("VOICY_", "CAIRN_"))}
    run = run_verb(only_redis)
    lines = run.stdout.splitlines()
    assert run.returncode == 1, run.stdout + run.stderr
    unchecked = (fleet.part("nats"), fleet.part("cairn consumers"))
    assert lines[-1] == f"UNVERIFIED: not checked: {', '.join(unchecked)}", lines
    for part in unchecked:
        line = next(line for line in lines if line.startswith(f"skip {part}: "))
        assert "CAIRN_NATS_URL is not set here" in line, line
    checked = {line.split(":", 1)[0].split(None, 1)[1] for line in lines[:-1] if line.startswith("ok ")}
    assert checked >= COMMON_PARTS | {fleet.part(p) for p in ("pool provider", "cairn presence", "cairn manifest")}


def test_another_pool_on_the_same_redis_is_judged_on_its_own(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several Cairn pools may share one Redis: a pool named by a worker's record (not the configured one)
    gets its own parts, and its trouble stays in them; without its own NATS login here, its NATS parts
    are skipped rather than asked with this pool's (core's template would refuse them)."""
    wait_for(fleet, monkeypatch, "")
    client = redis.Redis.from_url(fleet.redis_url)
    other = liveness.ProcessRecord(role=liveness.WORKER, name="garmin.1@elsewhere", queues=["provider.other-pool"],
                                   pool="other-pool", provider="strava", cairn_instance="garmin-1-elsewhere",
                                   presence_at=time.time() - 3600, presence_webhooks=False)  # stale
    liveness.renew(client, other)
    try:
        checks = verdict(fleet.health_env(), monkeypatch)
        assert failing(checks).keys() == {"cairn presence other-pool", "cairn manifest other-pool"}, failing(checks)
        assert checks["pool provider.other-pool"].status == "ok"
        assert checks["nats other-pool"].status == "skip" and checks["cairn consumers other-pool"].status == "skip"
        mine = checks[fleet.part("pool provider")].detail + checks[fleet.part("cairn presence")].detail
        assert "elsewhere" not in mine
    finally:
        liveness.forget(client, liveness.WORKER, other.name)
        client.close()


def test_a_deleted_consumer_fails_until_the_bridge_binds_it_again(fleet: Fleet,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    wait_for(fleet, monkeypatch, "")
    with monkeypatch.context() as patched:
        patched.setenv("CAIRN_WORKER_NAME", fleet.pool)
        settings = load_cairn_settings()
    (consumer,) = [c for c in health.needed_consumers(settings) if c.kind == "fetch_source"]

    async def on_jetstream(delete: bool) -> None:  # as core: the pool's own login may not delete
        nc = await nats.connect(fleet.nats.url, **services.nats_auth_of(fleet.nats).core.connect_options())
        try:
            js = nc.jetstream()
            if delete:
                await js.delete_consumer(consumer.stream, consumer.durable)
            else:  # as the bridge makes it at start
                await ensure_consumers(js, [consumer], DEFAULT_ACK_WAIT_S, DEFAULT_MAX_DELIVER)
        finally:
            await nc.close()

    asyncio.run(on_jetstream(delete=True))
    try:
        checks = verdict(fleet.health_env(), monkeypatch)
        assert failing(checks).keys() == {fleet.part("cairn consumers")}, failing(checks)
        assert f"missing: {consumer.durable}" in checks[fleet.part("cairn consumers")].detail
    finally:
        asyncio.run(on_jetstream(delete=False))
    wait_for(fleet, monkeypatch, "")
