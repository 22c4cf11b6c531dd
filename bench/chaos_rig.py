"""The chaos harness's world: the dev stack, the Procfile fleet under a supervisor, and the load.

Everything on loopback, in one temporary directory:

* Redis with an AOF (``devstack.infra.services.start_redis``), nats-server with JetStream on
  disk, moto S3 in its own process;
* the dev Voicy Worker API and fake Telegram (each download held
  ``TELEGRAM_DELAY_S``, so a kill can land mid-download), the dev Cairn core and
  the fake Strava behind ``LatencyMiddleware`` (``STRAVA_DELAY_S`` a call);
* the Procfile's own command lines, ``formation()`` dynos, under
  ``devstack.infra.supervisor.Supervisor`` (Flower, ``web``, is left out: it
  holds no work).

Timings are shortened where the defaults would only make the run longer
(AckWait, leases, Voicy's stale-job cutoff); each is a named constant below
and is printed in docs/RELIABILITY.md with the figures.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devstack.fakes.strava import FakeStrava
from devstack.fakes.strava.kit import StravaKit
from devstack.fakes.synth_media import SpeechSynth
from devstack.fakes.telegram import FakeTelegram
from devstack.fakes.voicy_api import DevVoicyServer
from devstack.infra import services
from devstack.infra.cairn_stack import CairnStack
from devstack.infra.procfile import entries as procfile_entries
from devstack.infra.procfile import provider_of, runnable
from devstack.infra.procs import Proc
from devstack.infra.stack import BOT_TOKEN, ROOT, fleet_env
from devstack.infra.supervisor import MAX_RESTART_DELAY_S, Placement, Supervisor
from devstack.netsim.latency import LatencyMiddleware
from workers.providers.kinds import FETCH_SOURCE

PROVIDER = "strava"
# One dyno of every Procfile process type but those that hold no work, and two gpu dynos: the
# Procfile's gpu line is ``-c 1``, so two gpu slots are two dynos, as a platform scales them (``gpu=2``).
# Read from the Procfile at run time, so a process type added later (a housekeeping queue) runs too.
NOT_RUN = frozenset({"web"})  # Flower: a dashboard, no work of the fleet
GPU_SLOTS = 2
IO_CONCURRENCY = 2
PROVIDER_CONCURRENCY = 4


def formation(procfile: dict[str, str]) -> dict[str, int]:
    """Dynos per process type: every runnable type of the Procfile except ``NOT_RUN`` and the lines of
    a pool the harness feeds no jobs (a line naming its own provider: the Garmin pool's), ``gpu`` scaled
    to ``GPU_SLOTS``. An idle pool's dynos would only draw kills away from the ones holding work."""
    return {kind: GPU_SLOTS if kind == "gpu" else 1 for kind, command in runnable(procfile)[0].items()
            if kind not in NOT_RUN and provider_of(command) in (None, PROVIDER)}


def is_celery_worker(command: str) -> bool:
    """A prefork worker line (its pool children are kill targets of their own)."""
    return "celery" in command and " worker" in command

SPEECH_MIN_S, SPEECH_MAX_S = 5.0, 16.0  # the target; whole sentences make the files 5-20 s long
TELEGRAM_DELAY_S = (0.5, 2.0)  # a download is held this long (uniform), so kills land mid-download
STRAVA_DELAY_S = 0.25  # every Strava API call
STRAVA_BUDGET = (10**9, 10**9)  # no 429s: the run measures faults, not rate limits
ATHLETES = 10
ATHLETE_ID_BASE = 500_000
FETCH_STREAMS = True  # two Strava calls a job (activity, streams): more time in flight

# Shortened timings (defaults in brackets), so that recovery fits in the quiescence bound.
VOICY_LEASE_TTL_MS = 10_000  # [30 000]
VOICY_HEARTBEAT_INTERVAL_MS = 3_000  # [30 000]
VOICY_STALE_ACTIVE_JOB_MS = 30_000  # server and fleet [900 000]: claim-ready recovers a dead transcription
VOICY_POLL_INTERVAL_MS = 500  # [1000]
CAIRN_ACK_WAIT_S = 10.0  # [30]: an unacked message of a dead bridge comes back this soon
CAIRN_LEASE_TTL_S = 15.0  # [15]

FEED_SPAN_FRACTION = 0.85  # jobs arrive evenly over this part of the window, so kills keep hitting work
PUBLISH_RETRY_S = 1.0
PUBLISH_GIVE_UP_S = 90.0  # a Cairn publish is retried (same Nats-Msg-Id: deduplicated) this long
READY_TIMEOUT_S = 240.0
READY_POLL_S = 1.0
REDIS_DOWN_S = 3.0
RESTART_CHECK_S = MAX_RESTART_DELAY_S + 15.0  # a dyno down at the end gets this long to come back
NATS_DOWN_S = 3.0


@dataclass
class VoicyJob:
    job_id: str
    file_id: str
    duration_s: float


@dataclass
class CairnJob:
    job_id: str
    payload: dict[str, Any]
    seq: int | None = None
    publish_error: str | None = None


@dataclass
class ChaosRig:
    """Start with ``start()``; ``feed()`` runs the load in a thread; ``stop()`` tears it all down."""

    workdir: Path
    seed: int
    voicy_jobs: int
    cairn_jobs: int
    pool: str = field(default_factory=lambda: f"chaos-{uuid.uuid4().hex[:6]}")
    voicy: list[VoicyJob] = field(default_factory=list)
    cairn: list[CairnJob] = field(default_factory=list)
    supervisor: Supervisor | None = None
    _procs: list[Proc] = field(default_factory=list)
    _feeder: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> ChaosRig:
        self.start_services()
        self.start_fleet()
        return self

    def start_services(self) -> None:
        """Redis, NATS, S3 and the dev servers and fakes (everything but the fleet)."""
        self.redis = self._start_redis()  # ours: restarted in place
        strava = FakeStrava(limits=STRAVA_BUDGET, read_limits=STRAVA_BUDGET)
        strava.tls = self._strava_tls()
        strava.app.add_middleware(LatencyMiddleware, delay_s=STRAVA_DELAY_S, prefix="/api/v3")
        self.strava_kit = StravaKit(strava, athlete_id_base=ATHLETE_ID_BASE)
        self.stack = CairnStack(self.workdir, redis_url=self.redis.url, fakes=[self.strava_kit], name=self.pool,
                                moto_process=True).start()
        assert self.stack.nats is not None and self.stack.core is not None and self.stack.s3_endpoint
        self.nats, self.core, self.strava = self.stack.nats, self.stack.core, strava
        self.s3_endpoint = self.stack.s3_endpoint
        self._pool = self.stack.pool(PROVIDER, self.pool)
        stale = {"VOICY_WORKER_STALE_ACTIVE_JOB_MS": str(VOICY_STALE_ACTIVE_JOB_MS)}
        self.voicy_api = DevVoicyServer(env=stale).start()
        self.telegram = FakeTelegram(BOT_TOKEN).start()

    def _start_redis(self) -> services.Service:
        """Redis with an AOF (a rig on Sentinel overrides it and names its Sentinels in the fleet's env)."""
        return services.start_redis(self.workdir / "redis", appendonly=True)

    def _strava_tls(self) -> tuple[Path, Path] | None:
        """The fake Strava's certificate and key when it must be https (a fleet on other hosts)."""
        return None

    def start_fleet(self, place: Placement | None = None, dynos: dict[str, int] | None = None) -> None:
        """The Procfile's formation (or ``dynos``) under a supervisor; ``place`` puts each dyno on a host."""
        token = self.voicy_api.create_client("switchyard-chaos")
        self.env = self._fleet_env(token)
        procfile = procfile_entries(ROOT / "Procfile")
        self.supervisor = Supervisor(procfile, dynos or formation(procfile), self.env, self.workdir,
                                     place=place).start()

    def _fleet_env(self, token: str) -> dict[str, str]:
        env = fleet_env(redis_url=self.redis.url, api_url=self.voicy_api.url, token=token,
                        telegram_url=self.telegram.url, work_dir=self.workdir / "media",
                        VOICY_WORKER_TRANSCRIPTION_CONCURRENCY=str(GPU_SLOTS),
                        VOICY_WORKER_LEASE_TTL_MS=str(VOICY_LEASE_TTL_MS),
                        VOICY_WORKER_HEARTBEAT_INTERVAL_MS=str(VOICY_HEARTBEAT_INTERVAL_MS),
                        VOICY_WORKER_STALE_ACTIVE_JOB_MS=str(VOICY_STALE_ACTIVE_JOB_MS),
                        VOICY_WORKER_POLL_INTERVAL_MS=str(VOICY_POLL_INTERVAL_MS))
        env.update(self.stack.pool_env(self._pool))
        env.update({
            "CAIRN_ACK_WAIT_S": str(CAIRN_ACK_WAIT_S), "CAIRN_LEASE_TTL_S": str(CAIRN_LEASE_TTL_S),
            "IO_CONCURRENCY": str(IO_CONCURRENCY), "PROVIDER_CONCURRENCY": str(PROVIDER_CONCURRENCY),
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        })
        return env

    def stop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()
        for proc in self._procs:
            proc.stop()
        for name in ("telegram", "voicy_api", "stack", "redis"):  # the stack: Strava, core, NATS, S3
            svc = getattr(self, name, None)
            if svc is not None:
                svc.stop()

    # --- infrastructure faults -------------------------------------------------------------------
    def restart_redis(self) -> None:
        self.redis = services.restart(self.redis, graceful=True, down_s=REDIS_DOWN_S)

    def restart_nats(self) -> None:
        self.nats = self.stack.nats = services.restart(self.nats, graceful=True, down_s=NATS_DOWN_S)

    # --- readiness -----------------------------------------------------------------------------
    def wait_ready(self) -> float:
        """Run one warm-up job per side through the fleet (models loaded, consumers made); seconds taken."""
        started = time.monotonic()
        rng = random.Random(self.seed ^ 0x5EED)
        warm_voicy = self._make_voicy(1, rng, "warm")[0]
        warm_cairn = self._make_cairn(2, "warm")
        for job in warm_cairn:
            self._publish(job)
        deadline = started + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            voicy_done = self.voicy_api.get_job(warm_voicy.job_id)["status"] in ("completed", "failed")
            cairn_done = all(self.cairn_results(j.job_id) for j in warm_cairn)
            if voicy_done and cairn_done:
                return time.monotonic() - started
            time.sleep(READY_POLL_S)  # the dev servers' records have no event to await across threads
        logs = self.supervisor.log_tails() if self.supervisor else ""
        raise RuntimeError(f"the fleet did not finish its warm-up jobs in {READY_TIMEOUT_S:.0f} s\n{logs}")

    # --- load ----------------------------------------------------------------------------------
    def prepare_load(self) -> None:
        """The measured jobs (speech files, athletes and payloads), made before the window opens."""
        rng = random.Random(self.seed)
        self.voicy = self._make_voicy(self.voicy_jobs, rng, "job", enqueue=False)
        self.cairn = self._make_cairn(self.cairn_jobs, "job")

    def _make_voicy(self, n: int, rng: random.Random, tag: str, *, enqueue: bool = True) -> list[VoicyJob]:
        synth = SpeechSynth()
        media = self.workdir / "voices"
        media.mkdir(exist_ok=True)
        jobs = []
        for i in range(n):
            file_id = f"chaos-{tag}-{i:03d}"
            path = media / f"{file_id}.ogg"
            duration, _ = synth.write_ogg(path, rng.uniform(SPEECH_MIN_S, SPEECH_MAX_S), rng)
            data = path.read_bytes()
            self.telegram.add_file(file_id, data)
            self.telegram.delay(file_id, rng.uniform(*TELEGRAM_DELAY_S))
            job = VoicyJob("", file_id, duration)
            if enqueue:
                self._enqueue_voicy(job)
            jobs.append(job)
        return jobs

    def _enqueue_voicy(self, job: VoicyJob) -> None:
        size = (self.workdir / "voices" / f"{job.file_id}.ogg").stat().st_size
        job.job_id = self.voicy_api.enqueue_job(job.file_id, file_size=size, mime_type="audio/ogg")

    def _make_cairn(self, n: int, tag: str) -> list[CairnJob]:
        jobs: list[CairnJob] = []
        per_athlete = -(-n // ATHLETES)
        while len(jobs) < n:
            count = min(per_athlete, n - len(jobs))
            acct = self.strava_kit.connect(self.core, self._pool, count, with_gear=False)
            for ext_id in acct.ext_ids:
                job_id = f"{tag}-{len(jobs):04d}-{uuid.uuid4().hex[:6]}"
                jobs.append(CairnJob(job_id, self.stack.fetch_job(acct, ext_id, job_id=job_id,
                                                                  fetch_streams=FETCH_STREAMS)))
        return jobs

    def _publish(self, job: CairnJob) -> None:
        """Publish one job, retrying through a NATS outage with the same ``Nats-Msg-Id`` (deduplicated)."""
        deadline = time.monotonic() + PUBLISH_GIVE_UP_S
        while True:
            try:
                job.seq = self.core.enqueue_job(FETCH_SOURCE, job.payload, f"chaos:{job.job_id}").seq
                job.publish_error = None
                return
            except Exception as exc:  # noqa: BLE001 - NATS down or reconnecting: try again
                job.publish_error = type(exc).__name__
                if time.monotonic() >= deadline:
                    return
                time.sleep(PUBLISH_RETRY_S)

    def feed(self, span_s: float) -> None:
        """Start a thread that enqueues every measured job, evenly interleaved over ``span_s``."""
        items: list[VoicyJob | CairnJob] = [*self.voicy, *self.cairn]
        random.Random(self.seed + 1).shuffle(items)
        step = span_s / max(1, len(items))

        def run() -> None:
            start = time.monotonic()
            for i, item in enumerate(items):
                delay = start + i * step - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # the load's own schedule
                if isinstance(item, VoicyJob):
                    self._enqueue_voicy(item)
                else:
                    self._publish(item)

        self._feeder = threading.Thread(target=run, name="chaos-feeder", daemon=True)
        self._feeder.start()

    def feeding(self) -> bool:
        return self._feeder is not None and self._feeder.is_alive()

    def join_feeder(self, timeout_s: float) -> None:
        if self._feeder is not None:
            self._feeder.join(timeout_s)

    # --- records ---------------------------------------------------------------------------------
    def cairn_results(self, job_id: str) -> list[Any]:
        return [r for r in self.core.ingested if r.msg_id and r.msg_id.startswith(f"result:{job_id}:")]
