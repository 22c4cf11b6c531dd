"""Voicy benchmark: N fixture jobs through the fleet against two baselines, in one run.

(a) the limit: faster-whisper called directly in one process on the same files,
    with the same model and options (beam 5, VAD, the fleet's CPU threads);
(b) Voicy's adapter: a new Python process per job that loads the model, as the
    bundled Windows worker does (one transcription at a time, its default).

The fleet runs twice: with one gpu slot (``-c 1``), the like-for-like run
against (a) and (b); and with the CPU-host configuration ``-c <cores>`` (one
CPU thread per process, ``VOICY_WORKER_CPU_THREADS`` auto), compared with (b)
run ``<cores>`` processes at a time, the same parallelism. (b) also reports its
start-up (interpreter, import, model load) separately from its transcription;
(b) / (a) is the most any warm worker with one slot could gain over it.
Also reports pickup latency (job queued → claimed, from the server's own
timestamps) and, with ``run_rss``, the gpu worker's RSS over many jobs.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from deploy.devstack import services
from deploy.devstack.procs import spawn
from deploy.devstack.stack import AUDIO_DIR, BOT_TOKEN, TINY_MODEL_DIR, audio_manifest, fleet_env, start_bridge

JOB_TIMEOUT_S = 1800.0
POLL_S = 0.5  # the server's own timestamps give the figures; polling only detects the end
CORES = len(os.sched_getaffinity(0))
READY_QUEUE_LIMIT = 4  # the fleet's backlog limit in every run
IDLE_PICKUP_JOBS = 10
IDLE_PICKUP_MAX_GAP_S = 1.0  # idle jobs arrive at random moments within this gap

# One job as Voicy's adapter runs it: a fresh interpreter that imports faster-whisper, loads the
# model and transcribes. It prints its own start-up and transcription times (the parent adds the
# interpreter's start to the start-up from its wall clock).
PROCESS_SNIPPET = """
import json, sys, time
t0 = time.perf_counter()
from faster_whisper import WhisperModel
m = WhisperModel(sys.argv[1], device="cpu", compute_type="int8", cpu_threads=int(sys.argv[2]),
                 local_files_only=True)
t1 = time.perf_counter()
segments, info = m.transcribe(sys.argv[3], vad_filter=True)
" ".join(s.text for s in segments)
print(json.dumps({"load_s": t1 - t0, "transcribe_s": time.perf_counter() - t1}))
"""


def _files(jobs: int) -> list[Path]:
    items = sorted(audio_manifest(), key=lambda m: m["name"])
    return [AUDIO_DIR / items[i % len(items)]["file"] for i in range(jobs)]


def baseline_direct(files: list[Path], cpu_threads: int) -> float:
    """(a): one process, model loaded once (load time excluded, like a warm fleet)."""
    from faster_whisper import WhisperModel

    model = WhisperModel(TINY_MODEL_DIR, device="cpu", compute_type="int8", cpu_threads=cpu_threads,
                         local_files_only=True)
    started = time.perf_counter()
    for path in files:
        segments, _ = model.transcribe(str(path), vad_filter=True)
        " ".join(s.text for s in segments)
    return time.perf_counter() - started


def _one_process_job(path: Path, cpu_threads: int) -> tuple[float, float]:
    """(start-up incl. interpreter, transcription) seconds of one process-per-job run."""
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", PROCESS_SNIPPET, TINY_MODEL_DIR, str(cpu_threads), str(path)],
                         check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - started
    transcribe_s = float(json.loads(out.strip().splitlines()[-1])["transcribe_s"])
    return wall - transcribe_s, transcribe_s


def baseline_process_per_job(files: list[Path], *, parallel: int, cpu_threads: int
                             ) -> tuple[float, list[tuple[float, float]]]:
    """(b): a fresh interpreter per job, ``parallel`` at a time; (wall seconds, per-job timings)."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        timings = list(pool.map(lambda f: _one_process_job(f, cpu_threads), files))
    return time.perf_counter() - started, timings


class FleetRig:
    """Redis + dev Voicy API + fake Telegram + io/gpu workers + bridge, all real processes."""

    def __init__(self, tmp: Path, gpu_concurrency: int = 1) -> None:
        from deploy.devstack.telegram import FakeTelegram
        from deploy.devstack.voicy_api import DevVoicyServer

        self.tmp = tmp
        self.redis = services.start_redis(tmp / "redis")
        self.server = DevVoicyServer()
        self.server.start()
        self.telegram = FakeTelegram(BOT_TOKEN)
        self.telegram.start()
        token = self.server.create_client("bench")
        self.env = fleet_env(redis_url=self.redis.url, api_url=self.server.url, token=token,
                             telegram_url=self.telegram.url, work_dir=tmp / "work",
                             VOICY_WORKER_READY_QUEUE_LIMIT=str(READY_QUEUE_LIMIT),
                             VOICY_WORKER_TRANSCRIPTION_CONCURRENCY=str(gpu_concurrency),
                             VOICY_WORKER_POLL_INTERVAL_MS="1000")
        self.procs = [
            spawn([sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "io", "-c", "2",
                   "-n", "io@bench", "-l", "WARNING"], self.env, tmp / "io.log"),
            spawn([sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "gpu", "-P", "prefork",
                   "-c", str(gpu_concurrency), "-n", "gpu@bench", "-l", "WARNING"], self.env, tmp / "gpu.log"),
        ]
        self.bridge = start_bridge(self.env, tmp / "bridge.log")

    def gpu_children(self) -> list[psutil.Process]:
        return psutil.Process(self.procs[1].proc.pid).children(recursive=True)

    def run_jobs(self, files: list[Path]) -> tuple[float, list[float]]:
        """Enqueue every file at once; return (seconds from first enqueue to last completion, pickups).

        Both figures come from the server's own timestamps (createdAt, claimedAt,
        completedAt), so the benchmark's polling adds nothing to them.
        """
        ids = []
        for n, path in enumerate(files):
            file_id = f"bench-{time.monotonic_ns()}-{n}"
            data = path.read_bytes()
            self.telegram.add_file(file_id, data)
            ids.append(self.server.enqueue_job(file_id, file_size=len(data), mime_type="audio/ogg"))
        pending = set(ids)
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while pending and time.monotonic() < deadline:
            for job_id in list(pending):
                if self.server.get_job(job_id)["status"] in ("completed", "failed"):
                    pending.discard(job_id)
            time.sleep(POLL_S)
        if pending:
            raise RuntimeError(f"{len(pending)} jobs did not finish")
        docs = [self.server.get_job(job_id) for job_id in ids]
        if any(d["status"] != "completed" for d in docs):
            raise RuntimeError("a benchmark job failed: " + str([d.get("lastError") for d in docs]))
        first = min(d["createdAt"] for d in docs)
        wall = (max(d["completedAt"] for d in docs) - first).total_seconds()
        pickups = [(d["claimedAt"] - d["createdAt"]).total_seconds() for d in docs]
        return wall, pickups

    def warm_up(self) -> None:
        self.run_jobs(_files(1))

    def close(self) -> None:
        self.bridge.stop()
        for p in self.procs:
            p.stop()
        self.telegram.stop()
        self.server.stop()
        self.redis.stop()


def _fleet(files: list[Path], gpu_slots: int, *, idle_pickups: bool) -> tuple[float, list[float], list[float]]:
    """(seconds for the burst, burst pickups, idle pickups) of one fleet with ``gpu_slots`` gpu processes."""
    with tempfile.TemporaryDirectory(prefix="sy-bench-") as tmp:
        rig = FleetRig(Path(tmp), gpu_concurrency=gpu_slots)
        try:
            rig.run_jobs(_files(2 * gpu_slots))  # every gpu process loads its model, as on a long-running host
            fleet_s, pickups = rig.run_jobs(files)
            idle: list[float] = []
            rng = random.Random(7)
            for path in files[:IDLE_PICKUP_JOBS] if idle_pickups else []:
                time.sleep(rng.uniform(0, IDLE_PICKUP_MAX_GAP_S))  # a job at a random moment of the poll
                idle.extend(rig.run_jobs([path])[1])
        finally:
            rig.close()
    return fleet_s, pickups, idle


def run(jobs: int = 20) -> dict[str, object]:
    files = _files(jobs)
    fleet_1, pickups, idle = _fleet(files, 1, idle_pickups=True)
    fleet_n, _, _ = _fleet(files, CORES, idle_pickups=False)
    direct_s = baseline_direct(files, cpu_threads=CORES)  # the threads the one-slot fleet's auto picks
    per_process_s, timings = baseline_process_per_job(files, parallel=1, cpu_threads=CORES)
    per_process_par_s, _ = baseline_process_per_job(files, parallel=CORES, cpu_threads=1)
    startup = statistics.median(t[0] for t in timings)
    return {
        "jobs": jobs, "cores": CORES,
        "one_slot": {
            "fleet_s": round(fleet_1, 2), "direct_s": round(direct_s, 2),
            "process_per_job_s": round(per_process_s, 2),
            "fleet_over_direct": round(fleet_1 / direct_s, 3),
            "speedup_over_process_per_job": round(per_process_s / fleet_1, 2),
            # a warm worker with no overhead at all is (a); nothing one slot runs can beat this
            "ceiling_any_warm_worker": round(per_process_s / direct_s, 2)},
        "cpu_host": {
            "gpu_slots": CORES, "fleet_s": round(fleet_n, 2),
            "process_per_job_same_parallelism_s": round(per_process_par_s, 2),
            "speedup_over_process_per_job_same_parallelism": round(per_process_par_s / fleet_n, 2),
            "speedup_over_voicy_default_one_at_a_time": round(per_process_s / fleet_n, 2)},
        "process_per_job_anatomy": {
            "startup_s_median": round(startup, 3),
            "cold_transcribe_s_mean": round(statistics.fmean(t[1] for t in timings), 3),
            "warm_transcribe_s_mean": round(direct_s / jobs, 3),
            "overhead_per_job_s": round((per_process_s - direct_s) / jobs, 3)},
        "pickup_median_idle_s": round(statistics.median(idle), 3),
        "pickup_median_burst_s": round(statistics.median(pickups), 3),
    }


def run_rss(jobs: int = 200) -> dict[str, float]:
    """RSS of the gpu pool child over ``jobs`` jobs, after one warm-up pass over every fixture.

    The warm-up touches every audio length once, so allocator high-water marks
    (glibc keeps freed buffers) are in the baseline; what grows after that is a leak.
    """
    n_fixtures = len(audio_manifest())
    with tempfile.TemporaryDirectory(prefix="sy-bench-rss-") as tmp:
        rig = FleetRig(Path(tmp))
        try:
            rig.run_jobs(_files(n_fixtures))
            first = sum(p.memory_info().rss for p in rig.gpu_children())
            rig.run_jobs(_files(jobs // 2))
            middle = sum(p.memory_info().rss for p in rig.gpu_children())
            rig.run_jobs(_files(jobs - jobs // 2))
            last = sum(p.memory_info().rss for p in rig.gpu_children())
        finally:
            rig.close()
    return {"jobs": jobs, "rss_after_warmup_mb": round(first / 2**20, 1),
            "rss_after_half_mb": round(middle / 2**20, 1), "rss_after_all_mb": round(last / 2**20, 1),
            "growth": round(last / first - 1, 4)}
