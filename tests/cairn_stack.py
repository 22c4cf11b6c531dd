"""A Cairn test stack: dev Cairn core, fake Strava behind a gate, real bridge and provider workers.

Everything is real except the external systems: nats-server with JetStream
(one per stack), Redis, moto S3 behind the dev core's presign responders,
``python -m bridges cairn``, ``celery -A tasks worker -Q provider``. Cairn core
is ``DevCairnCore`` and Strava is ``FakeStrava``; a gate in front of the fake's
activity endpoint lets a test hold a job mid-flight for as long as it needs (a
slow provider). Used by the e2e, checker and shutdown tests.

AckWait is 1 s here (``CAIRN_ACK_WAIT_S``), so "five AckWaits" takes five seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import redis

from deploy.devstack import services
from deploy.devstack.cairn_core import DevCairnCore
from deploy.devstack.nats_auth import NatsAuth, Pool
from deploy.devstack.procs import Proc, spawn
from deploy.devstack.strava import FakeStrava
from tests.conftest import CeleryWorker, wait_until
from tests.gate import Gate, GateMiddleware

ROOT = Path(__file__).resolve().parents[1]
PROVIDER = "strava"
ACK_WAIT_S = 1.0
LEASE_TTL_S = 3.0
START_DEADLINE_S = 20.0
STRAVA_ACTIVITY_PATH = r"/api/v3/activities/\d+$"  # the gate holds activity detail calls
WAIT_S = 30.0
BRIDGE_STOP_TIMEOUT_S = 30.0  # SIGTERM → SIGKILL: above the bridge's own 20 s shutdown grace for running jobs
ATHLETE_BASE = 7000


@dataclass
class CairnStack:
    """One dev Cairn world for a test module; ``start()`` brings the pool up."""

    tmp: Path
    redis_url: str
    s3_endpoint: str
    pool: str = field(default_factory=lambda: f"sy-{uuid.uuid4().hex[:6]}")
    nats: services.Service | None = None
    core: DevCairnCore | None = None
    strava: FakeStrava | None = None
    gate: Gate = field(default_factory=lambda: Gate.path_pattern(STRAVA_ACTIVITY_PATH))
    workers: list[CeleryWorker] = field(default_factory=list)
    bridge: Proc | None = None
    extra_env: dict[str, str] = field(default_factory=dict)  # CAIRN_* overrides of one stack (bridge, workers)
    nats_withheld: tuple[str, ...] = ()  # subjects left out of the pool's NATS permissions (a refusal test)
    _athletes: int = 0

    def start(self) -> CairnStack:
        redis.Redis.from_url(self.redis_url).flushall()
        self.start_core()
        self.strava = FakeStrava()
        self.strava.app.add_middleware(GateMiddleware, gate=self.gate)
        self.strava.start()
        return self

    def start_core(self) -> DevCairnCore:
        """nats-server under core's permission template for this pool, and the dev core on it as ``core``."""
        self.nats = services.start_nats(self.tmp / "nats", pools=[self.pool_ref], withheld=self.nats_withheld)
        self.core = DevCairnCore(self.nats.url, self.s3_endpoint, bucket=f"cairn-{self.pool}",
                                 nats_login=self.nats_auth.core.connect_options()).start()
        return self.core

    def stop(self) -> None:
        if self.bridge is not None:
            self.bridge.stop()
        for w in self.workers:
            w.stop()
        if self.strava is not None:
            self.gate.open()
            self.strava.stop()
        if self.core is not None:
            self.core.stop()
        if self.nats is not None:
            self.nats.stop()

    @property
    def pool_ref(self) -> Pool:
        return Pool(self.extra_env.get("CAIRN_PROVIDER", PROVIDER), self.pool)

    @property
    def nats_auth(self) -> NatsAuth:
        """The server's users and log: the pool logs in as ``worker`` (core's template, contract §1)."""
        assert self.nats is not None
        return services.nats_auth_of(self.nats)

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VOICY_", "CAIRN_", "AWS_"))}
        env.update({
            "REDIS_URL": self.redis_url,
            "CAIRN_NATS_URL": self.nats.url if self.nats else "",
            "CAIRN_PROVIDER": PROVIDER,
            "CAIRN_WORKER_NAME": self.pool,
            "CAIRN_ACK_WAIT_S": str(ACK_WAIT_S),
            "CAIRN_LEASE_TTL_S": str(LEASE_TTL_S),
            "CAIRN_TASK_START_DEADLINE_S": str(START_DEADLINE_S),
            "CAIRN_MAX_IN_FLIGHT": "4",
            "CAIRN_STRAVA_BASE_URL": self.strava.base_url if self.strava else "",
            "PYTHONUNBUFFERED": "1",
        })
        if self.nats is not None:
            env.update(self.nats_auth.login(self.pool_ref).env())
        env.update(self.extra_env)
        return env

    def live_workers(self) -> list[CeleryWorker]:
        return [w for w in self.workers if w.proc.poll() is None]

    def start_worker(self, concurrency: int = 2) -> CeleryWorker:
        name = f"provider-{len(self.workers)}-{uuid.uuid4().hex[:4]}@test"
        worker = CeleryWorker("provider", self.env, self.tmp / f"worker-{len(self.workers)}.log",
                              concurrency=concurrency, name=name)
        self.workers.append(worker)
        worker.wait_ready(self.redis_url)
        return worker

    def spawn_bridge(self, name: str = "bridge", env: dict[str, str] | None = None) -> Proc:
        return spawn([sys.executable, "-m", "bridges", "cairn"], env or self.env, self.tmp / f"{name}.log",
                     stop_timeout_s=BRIDGE_STOP_TIMEOUT_S)

    def start_bridge(self) -> Proc:
        self.bridge = self.spawn_bridge()
        wait_until(lambda: "cairn bridge started" in self.bridge.log() or self.bridge.proc.poll() is not None,
                   WAIT_S, "the bridge to start")
        assert self.bridge.proc.poll() is None, self.bridge.log()[-3000:]
        return self.bridge

    def connect_athlete(self, n_activities: int = 3, *, own_app: bool = False) -> Any:
        """A connected account; ``own_app`` gives it its own Strava app (its own rate-limit budget)."""
        assert self.core is not None and self.strava is not None
        self._athletes += 1
        athlete_id = ATHLETE_BASE + self._athletes
        client_id, secret = self.strava.client_id, self.strava.client_secret
        if own_app:
            client_id, secret = f"app-{athlete_id}", f"secret-{uuid.uuid4().hex}"
            self.strava.add_app(client_id, secret)
        ath = self.strava.add_athlete(athlete_id, n_activities=n_activities, with_gear=False, client_id=client_id)
        return self.core.connect_account(PROVIDER, None, ath.access_token, ath.refresh_token, ath.expires_at,
                                         worker_name=self.pool, external_id=athlete_id,
                                         client_id=client_id, client_secret=secret)

    def first_activity_id(self, acct: Any) -> str:
        assert self.strava is not None
        ath = self.strava.athlete(int(acct.external_id))
        return str(sorted(ath.activities)[0])

    def fetch_job(self, acct: Any, ext_id: str, job_id: str | None = None) -> dict[str, Any]:
        return {"job_id": job_id or f"job-{uuid.uuid4().hex[:10]}", "account_id": acct.account_id,
                "user_id": acct.user_id, "provider": PROVIDER, "ext_id": ext_id, "fetch_streams": True,
                "reason": "backfill"}

    def publish_raw(self, kind: str, body: bytes) -> None:
        async def run() -> None:
            nc = await nats.connect(self.nats.url)  # type: ignore[union-attr]
            try:
                await nc.jetstream().publish(f"cairn.jobs.{kind}.{PROVIDER}.{self.pool}", body,
                                             headers={"Nats-Msg-Id": f"raw:{uuid.uuid4().hex}"})
            finally:
                await nc.close()
        asyncio.run(run())

    def consumer(self, kind: str) -> dict[str, Any]:
        assert self.core is not None
        subject = f"cairn.jobs.{kind}.{PROVIDER}.{self.pool}"
        return next(c for c in self.core.consumers() if c["filter_subject"] == subject)

    def results_for(self, job_id: str) -> list[Any]:
        assert self.core is not None
        return [r for r in self.core.ingested if r.msg_id and f":{job_id}" in r.msg_id
                and not r.msg_id.endswith(":seg")]  # the activity's result, not its segments

    def all_logs(self) -> str:
        parts = [w.log() for w in self.workers]
        if self.bridge is not None:
            parts.append(self.bridge.log())
        return "\n".join(parts)


@contextlib.contextmanager
def running_stack(tmp: Path, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    """A started stack with one provider worker and a bridge, stopped on exit (a module fixture's body)."""
    s = CairnStack(tmp, redis_url, s3_endpoint).start()
    try:
        s.start_worker()
        s.start_bridge()
        yield s
    finally:
        s.stop()
