"""A Cairn test stack: the devstack kit's world, fake Strava behind a gate, real bridge and provider workers.

Everything is real except the external systems: nats-server with JetStream
(one per stack), Redis, moto S3 behind the dev core's presign responders,
``python -m bridges cairn``, ``celery -A tasks worker -Q provider.<pool>``. The
world itself (NATS, the dev core, the fake, pools and accounts) is
``devstack.infra.cairn_stack`` — the kit the bench and the demo use too — with
NATS under core's permission template (the pool logs in as ``worker``); this
module adds what only tests need: a gate in front of the fake's activity
endpoint that lets a test hold a job mid-flight for as long as it needs (a slow
provider), worker and bridge processes with their logs, and one pool per stack
whose name is ``stack.pool``.

AckWait is 1 s here (``CAIRN_ACK_WAIT_S``), so "five AckWaits" takes five seconds.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from devstack.fakes.cairn_core import DevCairnCore
from devstack.fakes.strava import FakeStrava
from devstack.fakes.strava.kit import ATHLETE_ID_BASE as ATHLETE_BASE  # noqa: F401 - tests pick ids above it
from devstack.fakes.strava.kit import StravaKit
from devstack.infra import cairn_stack, services
from devstack.infra.nats_auth import NatsAuth, Pool
from devstack.infra.procs import Proc, spawn
from tasks.routes import provider_queue
from tests.kit.celery_worker import CeleryWorker
from tests.kit.gate import Gate, GateMiddleware
from tests.kit.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
PROVIDER = "strava"
ACK_WAIT_S = 1.0
LEASE_TTL_S = 3.0
START_DEADLINE_S = 20.0
STRAVA_ACTIVITY_PATH = r"/api/v3/activities/\d+$"  # the gate holds activity detail calls
WAIT_S = 30.0
BRIDGE_STOP_TIMEOUT_S = 30.0  # SIGTERM → SIGKILL: above the bridge's own 20 s shutdown grace for running jobs
TEST_ENV = {"CAIRN_ACK_WAIT_S": str(ACK_WAIT_S), "CAIRN_LEASE_TTL_S": str(LEASE_TTL_S),
            "CAIRN_TASK_START_DEADLINE_S": str(START_DEADLINE_S), "CAIRN_MAX_IN_FLIGHT": "4"}


@dataclass
class CairnStack:
    """One dev Cairn world for a test module; ``start()`` brings the pool up."""

    tmp: Path
    redis_url: str
    s3_endpoint: str
    pool: str = field(default_factory=lambda: f"sy-{uuid.uuid4().hex[:6]}")
    gate: Gate = field(default_factory=lambda: Gate.path_pattern(STRAVA_ACTIVITY_PATH))
    workers: list[CeleryWorker] = field(default_factory=list)
    bridge: Proc | None = None
    extra_env: dict[str, str] = field(default_factory=dict)  # CAIRN_* overrides of one stack (bridge, workers)
    nats_withheld: tuple[str, ...] = ()  # subjects left out of the pool's NATS permissions (a refusal test)
    nats_anonymous: bool = True  # False: NATS refuses a client without a login, as a production core does
    kit: cairn_stack.CairnStack | None = None

    def start(self) -> CairnStack:
        self._flush()
        self.kit = cairn_stack.CairnStack(self.tmp, redis_url=self.redis_url, s3_endpoint=self.s3_endpoint,
                                          fakes=self.provider_fakes(), name=self.pool, pools=[self.pool_ref],
                                          nats_withheld=self.nats_withheld, nats_anonymous=self.nats_anonymous).start()
        return self

    def provider_fakes(self) -> list[cairn_stack.ProviderFake]:
        """The stack's provider fakes: the fake Strava behind the gate (a Garmin stack: its fake)."""
        fake = FakeStrava()
        fake.app.add_middleware(GateMiddleware, gate=self.gate)
        return [StravaKit(fake)]

    def _flush(self) -> None:
        redis.Redis.from_url(self.redis_url).flushall()

    def stop(self) -> None:
        if self.bridge is not None:
            self.bridge.stop()
        for w in self.workers:
            w.stop()
        self.gate.open()
        if self.kit is not None:
            self.kit.stop()

    # ------------------------------------------------------------------ the world (the kit's)
    @property
    def nats(self) -> services.Service:
        assert self.kit is not None and self.kit.nats is not None, "the stack is not started"
        return self.kit.nats

    @property
    def core(self) -> DevCairnCore:
        assert self.kit is not None and self.kit.core is not None, "the stack is not started"
        return self.kit.core

    @property
    def strava(self) -> FakeStrava:
        return self._strava_kit.fake

    @property
    def _strava_kit(self) -> StravaKit:
        assert self.kit is not None
        kit = self.kit.fake(PROVIDER)
        assert isinstance(kit, StravaKit)
        return kit

    @property
    def pool_ref(self) -> Pool:
        """The stack's pool (its provider is ``CAIRN_PROVIDER`` of ``extra_env``, else Strava)."""
        return Pool(self.extra_env.get("CAIRN_PROVIDER", PROVIDER), self.pool)

    @property
    def nats_auth(self) -> NatsAuth:
        """The server's users and log: the pool logs in as ``worker`` (core's template, contract §1)."""
        assert self.kit is not None
        return self.kit.nats_auth

    @property
    def env(self) -> dict[str, str]:
        assert self.kit is not None
        return self.kit.env(self.pool_ref, **TEST_ENV, **self.extra_env)

    # ------------------------------------------------------------------ processes
    def live_workers(self) -> list[CeleryWorker]:
        return [w for w in self.workers if w.proc.poll() is None]

    def start_worker(self, concurrency: int = 2) -> CeleryWorker:
        name = f"provider-{len(self.workers)}-{uuid.uuid4().hex[:4]}@test"
        worker = CeleryWorker(provider_queue(self.pool), self.env, self.tmp / f"worker-{len(self.workers)}.log",
                              concurrency=concurrency, name=name)
        self.workers.append(worker)
        worker.wait_ready(self.redis_url)
        return worker

    def spawn_bridge(self, name: str = "bridge", env: dict[str, str] | None = None) -> Proc:
        return spawn([sys.executable, "-m", "bridges", "cairn"], env or self.env, self.tmp / f"{name}.log",
                     stop_timeout_s=BRIDGE_STOP_TIMEOUT_S)

    def start_bridge(self) -> Proc:
        self.bridge = bridge = self.spawn_bridge()
        wait_until(lambda: "cairn bridge started" in bridge.log() or bridge.proc.poll() is not None,
                   WAIT_S, "the bridge to start")
        assert bridge.proc.poll() is None, bridge.log()[-3000:]
        return bridge

    # ------------------------------------------------------------------ accounts and jobs
    def connect_athlete(self, n_activities: int = 3, *, own_app: bool = False) -> Any:
        """A connected account; ``own_app`` gives it its own Strava app (its own rate-limit budget)."""
        connected = self._strava_kit.connect(self.core, Pool(PROVIDER, self.pool), n_activities,
                                             own_app=own_app, with_gear=False)
        return connected.account

    def hold_at_the_gate(self, job: dict[str, Any]) -> None:
        """Publish the fetch_source ``job`` with the gate armed; return once its task waits at the gate."""
        self.gate.arm()
        self.core.enqueue_job("fetch_source", job)
        assert self.gate.arrived.wait(WAIT_S), "the job never reached Strava"

    def first_activity_id(self, acct: Any) -> str:
        ath = self.strava.athlete(int(acct.external_id))
        return str(sorted(ath.activities)[0])

    def fetch_job(self, acct: Any, ext_id: str, job_id: str | None = None) -> dict[str, Any]:
        return cairn_stack.CairnStack.fetch_job(acct, ext_id, job_id=job_id)

    def publish_raw(self, kind: str, body: bytes) -> None:
        assert self.kit is not None
        self.kit.publish_raw(self.pool_ref, kind, body)

    def consumer(self, kind: str) -> dict[str, Any]:
        assert self.kit is not None
        return self.kit.consumer(self.pool_ref, kind)

    def results_for(self, job_id: str) -> list[Any]:
        assert self.kit is not None
        return self.kit.results_for(job_id)

    def has_result(self, job_id: str) -> bool:
        """Whether core ingested a result for ``job_id`` (a predicate to wait on)."""
        return bool(self.results_for(job_id))

    def all_logs(self) -> str:
        parts = [w.log() for w in self.workers]
        if self.bridge is not None:
            parts.append(self.bridge.log())
        return "\n".join(parts)


@contextlib.contextmanager
def started_stack(tmp: Path, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    """A started stack, its workers and bridges left to the test, stopped on exit (a fixture's body)."""
    s = CairnStack(tmp, redis_url, s3_endpoint).start()
    try:
        yield s
    finally:
        s.stop()


@contextlib.contextmanager
def running_stack(tmp: Path, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    """A started stack with one provider worker and a bridge, stopped on exit (a module fixture's body)."""
    with started_stack(tmp, redis_url, s3_endpoint) as s:
        s.start_worker()
        s.start_bridge()
        yield s
