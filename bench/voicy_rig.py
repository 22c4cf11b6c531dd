"""The voicy bench's rig: the Procfile's Voicy processes at production settings, and the direct baseline.

* Redis; the dev Voicy API and the fake Telegram in this process, each behind
  a request clock (``bench.voicy_trace``); a Celery event receiver.
* The fleet: the Procfile's own ``voicy_bridge``, ``io``, ``gpu`` and ``beat``
  lines, run as Heroku runs them (``devstack.infra.procfile``), with the
  production defaults of every interval: poll 1000 ms, progress 2500 ms,
  lease TTL 30 s, heartbeat 30 s (beat runs, so heartbeats and reaps happen).
  Only what points the fleet at the rig is set (``devstack.infra.stack.fleet_env``
  minus its test-speed intervals).
* :class:`Direct`: ``python -m bench.direct serve``, the model loaded once and
  warmed, with the threads the fleet's gpu process resolves.

CPU per process over a run (:meth:`FleetRig.cpu_seconds`) comes from psutil,
every process of each Procfile type's group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.voicy_trace import TaskEvents, TimedTelegram, TimedVoicyServer
from devstack.infra import procfile, services
from devstack.infra.procs import ROOT
from devstack.infra.stack import BOT_TOKEN, fleet_env
from workers.transcribe.device import resolve_cpu_threads, usable_cores
from workers.transcribe.settings import AUTO_CPU_THREADS

FLEET_TYPES = ("voicy_bridge", "io", "gpu", "beat")  # the Procfile lines a Voicy deployment runs
# fleet_env's test-speed intervals, removed so the fleet runs at the production defaults
TEST_INTERVALS = ("VOICY_WORKER_POLL_INTERVAL_MS", "VOICY_WORKER_PROGRESS_INTERVAL_MS",
                  "VOICY_WORKER_LEASE_TTL_MS", "VOICY_WORKER_HEARTBEAT_INTERVAL_MS")
GPU_SLOTS = 1  # the Procfile's gpu line: prefork -c 1
POOLED_TYPES = ("io", "gpu")  # Celery workers whose main process and pool are counted apart
RIG = "rig (this process: dev Voicy, fake Telegram)"
JOB_TIMEOUT_S = 1800.0
ENDING_CALLS = {"result", "failure"}  # a job's last call to Voicy
DIRECT_START_TIMEOUT_S = 300.0
IDLE_SAMPLE_S = 10.0  # how long the idle fleet's background CPU is sampled


def fleet_threads() -> int:
    """The CPU threads the Procfile's gpu process gives its model (``VOICY_WORKER_CPU_THREADS`` auto)."""
    return resolve_cpu_threads(AUTO_CPU_THREADS, "cpu", GPU_SLOTS, usable_cores())


def baseline_env() -> dict[str, str]:
    """The baselines' environment: this one without ``VOICY_*``, as the fleet gets it (``fleet_env``), so
    both build the engine from the same (default) settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith("VOICY_")}


@dataclass
class Burst:
    """One run of jobs through the fleet, from the server's own timestamps."""

    job_ids: list[str]
    file_ids: list[str]
    docs: list[dict]
    started: float  # epoch s: first enqueue
    ended: float  # epoch s: last completion seen

    @property
    def processing_s(self) -> float:
        """First claim → last completion: the fleet's time for the work (pickup excluded)."""
        first = min(d["claimedAt"] for d in self.docs)
        return (max(d["completedAt"] for d in self.docs) - first).total_seconds()

    @property
    def pickup_s(self) -> float:
        """First enqueue → first claim: the poll wait (Voicy's workers poll; direct has no queue)."""
        return (min(d["claimedAt"] for d in self.docs) - min(d["createdAt"] for d in self.docs)).total_seconds()

    @property
    def texts(self) -> list[str]:
        return [d.get("resultText", "") for d in self.docs]


class FleetRig:
    """Everything the fleet needs, on loopback, and the fleet itself."""

    def __init__(self, tmp: Path, extra_env: dict[str, str] | None = None) -> None:
        """``extra_env``: variables on top of the production defaults (the capacity bench's null engine)."""
        self.tmp = tmp
        self.redis = services.start_redis(tmp / "redis")
        self.server = TimedVoicyServer().start()
        self.telegram = TimedTelegram(BOT_TOKEN).start()
        self.events = TaskEvents(self.redis.url).start()
        env = fleet_env(redis_url=self.redis.url, api_url=self.server.url, token=self.server.create_client("bench"),
                        telegram_url=self.telegram.url, work_dir=tmp / "work",
                        PATH=f"{Path(sys.executable).parent}:" + os.environ.get("PATH", ""))
        for name in TEST_INTERVALS:  # production's defaults (the dev fleet already leaves some of them)
            env.pop(name, None)
        env.update(extra_env or {})
        self.env = env
        logs = tmp / "logs"
        logs.mkdir()
        self.fleet = procfile.Fleet(
            {name: procfile.run(name, {**env, "HONCHO_PROCESS_NAME": f"{name}.1"}, logs / f"{name}.log")
             for name in FLEET_TYPES}, logs)
        self._n = 0

    def run(self, files: list[Path]) -> Burst:
        """Enqueue every file at once; wait until every job completed."""
        started = time.time()
        job_ids, file_ids = [], []
        for path in files:
            self._n += 1
            file_id = f"bench{self._n:05d}"
            data = path.read_bytes()
            self.telegram.add_voice(file_id, data)
            job_ids.append(self.server.enqueue_job(file_id, file_size=len(data), mime_type="audio/ogg"))
            file_ids.append(file_id)
        pending = self.server.clock.wait_for_calls(ENDING_CALLS, set(job_ids), JOB_TIMEOUT_S)
        if pending:
            raise RuntimeError(f"{len(pending)} jobs did not finish; logs in {self.tmp / 'logs'}")
        docs = [self.server.get_job(j) for j in job_ids]
        failed = [d.get("lastError") for d in docs if d["status"] != "completed"]
        if failed:
            raise RuntimeError(f"benchmark jobs failed: {failed}")
        return Burst(job_ids, file_ids, docs, started, time.time())

    def processes(self) -> dict[str, list[psutil.Process]]:
        """Every live process of each fleet type, of Redis, and this process (the fakes)."""
        found: dict[str, list[psutil.Process]] = {}
        for name, proc in self.fleet.procs.items():
            try:
                top = psutil.Process(proc.proc.pid)
                children = top.children(recursive=True)
            except psutil.NoSuchProcess:
                found[name] = []
                continue
            if name in POOLED_TYPES:  # a Celery worker: its main process and its pool apart
                found[f"{name} main"], found[f"{name} pool"] = [top], children
            else:
                found[name] = [top, *children]
        found["redis"] = [psutil.Process(self.redis.proc.pid)] if self.redis.proc is not None else []
        found[RIG] = [psutil.Process()]
        return found

    def gpu_child_rss(self) -> int:
        """Resident bytes of the gpu worker's pool processes (where the model lives)."""
        top = psutil.Process(self.fleet.procs["gpu"].proc.pid)
        return sum(p.memory_info().rss for p in top.children(recursive=True))

    def cpu_seconds(self) -> dict[str, float]:
        """User + system CPU seconds so far, by process type."""
        totals: dict[str, float] = {}
        for name, procs in self.processes().items():
            total = 0.0
            for p in procs:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.NoSuchProcess:
                    continue
            totals[name] = total
        return totals

    def idle_cpu_ms_per_s(self, seconds: float = IDLE_SAMPLE_S) -> dict[str, float]:
        """CPU ms per second of each process type with no job at all: polls, heartbeats, beat's ticks."""
        before = self.cpu_seconds()
        time.sleep(seconds)  # the measurement is of this stretch of idleness itself
        after = self.cpu_seconds()
        return {name: round(1000 * (after[name] - before.get(name, 0.0)) / seconds, 2) for name in after}

    def close(self) -> None:
        self.fleet.stop()
        self.events.stop()
        self.telegram.stop()
        self.server.stop()
        self.redis.stop()


class Direct:
    """``python -m bench.direct serve``: faster-whisper in a warm process of its own."""

    def __init__(self, threads: int, warm_up: list[Path]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.direct", "serve", str(threads)], cwd=ROOT,
                                     env=baseline_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)
        if not self._ask(warm_up).get("ready"):
            raise RuntimeError("the direct baseline did not start")

    def _ask(self, files: list[Path]) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([str(f) for f in files]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the direct baseline exited ({self.proc.wait()})")
        return json.loads(line)

    def run(self, files: list[Path]) -> dict:
        """``wall_s``, ``cpu_s``, ``per_file_s``, ``texts`` of transcribing ``files`` back to back."""
        return self._ask(files)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(DIRECT_START_TIMEOUT_S)


def process_per_job(files: list[Path], threads: int) -> tuple[float, list[tuple[float, float]]]:
    """(b): a fresh interpreter per job, one at a time: (wall seconds, per job (start-up s, transcription s))."""
    started = time.perf_counter()
    timings = []
    for path in files:
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "bench.direct", "once", str(threads), str(path)], cwd=ROOT,
                             env=baseline_env(), check=True, capture_output=True, text=True,
                             start_new_session=True).stdout
        wall = time.perf_counter() - t0
        transcribe_s = float(json.loads(out.strip().splitlines()[-1])["transcribe_s"])
        timings.append((wall - transcribe_s, transcribe_s))
    return time.perf_counter() - started, timings
