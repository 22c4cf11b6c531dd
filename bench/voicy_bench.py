"""Voicy benchmark: N fixture jobs through the fleet against two baselines, in one run.

(a) the limit: faster-whisper called directly in one process on the same files,
    with the same model and options;
(b) Voicy's adapter: a new Python process per job that loads the model, as the
    bundled Windows worker does.
Also reports pickup latency (job queued → claimed, from the server's own
timestamps) and, with ``run_rss``, the gpu worker's RSS over many jobs.
"""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from deploy.devstack import services
from deploy.devstack.procs import spawn
from tests.voicy_stack import AUDIO_DIR, BOT_TOKEN, TINY_MODEL_DIR, audio_manifest, fleet_env, start_bridge

JOB_TIMEOUT_S = 1800.0
POLL_S = 0.5  # the server's own timestamps give the figures; polling only detects the end

DIRECT_SNIPPET = """
import sys, time
from faster_whisper import WhisperModel
m = WhisperModel(sys.argv[1], device="cpu", compute_type="int8", local_files_only=True)
for path in sys.argv[2:]:
    segments, info = m.transcribe(path, vad_filter=True)
    " ".join(s.text for s in segments)
"""


def _files(jobs: int) -> list[Path]:
    items = sorted(audio_manifest(), key=lambda m: m["name"])
    return [AUDIO_DIR / items[i % len(items)]["file"] for i in range(jobs)]


def baseline_direct(files: list[Path]) -> float:
    """(a): one process, model loaded once (load time excluded, like a warm fleet)."""
    from faster_whisper import WhisperModel

    model = WhisperModel(TINY_MODEL_DIR, device="cpu", compute_type="int8", local_files_only=True)
    started = time.perf_counter()
    for path in files:
        segments, _ = model.transcribe(str(path), vad_filter=True)
        " ".join(s.text for s in segments)
    return time.perf_counter() - started


def baseline_process_per_job(files: list[Path]) -> float:
    """(b): a fresh interpreter per job that imports faster-whisper and loads the model."""
    started = time.perf_counter()
    for path in files:
        subprocess.run([sys.executable, "-c", DIRECT_SNIPPET, TINY_MODEL_DIR, str(path)], check=True)
    return time.perf_counter() - started


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
                             VOICY_WORKER_READY_QUEUE_LIMIT="4",
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


def run(jobs: int = 20) -> dict[str, float]:
    files = _files(jobs)
    with tempfile.TemporaryDirectory(prefix="sy-bench-") as tmp:
        rig = FleetRig(Path(tmp))
        try:
            rig.warm_up()  # the model loads on the first job, as on a long-running GPU host
            fleet_s, pickups = rig.run_jobs(files)
            idle_pickups = []
            rng = random.Random(7)
            for path in files[:10]:  # pickup on an idle fleet: one job at a random moment
                time.sleep(rng.uniform(0, 1.0))
                _, p = rig.run_jobs([path])
                idle_pickups.extend(p)
        finally:
            rig.close()
    direct_s = baseline_direct(files)
    per_process_s = baseline_process_per_job(files)
    return {
        "jobs": jobs,
        "fleet_s": round(fleet_s, 2),
        "direct_s": round(direct_s, 2),
        "process_per_job_s": round(per_process_s, 2),
        "fleet_over_direct": round(fleet_s / direct_s, 3),
        "speedup_over_process_per_job": round(per_process_s / fleet_s, 2),
        "pickup_median_idle_s": round(statistics.median(idle_pickups), 3),
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
