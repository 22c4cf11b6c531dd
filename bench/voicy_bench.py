"""Voicy benchmark: the fleet against faster-whisper direct and a process per job, measured alike.

``python -m bench voicy [--jobs N] [--repeats R]``. The ceiling holds by construction:

* **Interleaved repeats.** Each of ``R`` (≥ 3) repeats runs the three sides
  back to back on the same ``N`` files, the order rotating from repeat to
  repeat (fleet, direct, process per job; then direct, process, fleet; …), so
  a shared box's load falls on every side alike. Reported: each repeat's
  figures, the median and the range.
* **The same work on both sides.** Direct (``bench.direct``) loads the model
  as the engine does (int8, CPU) with the threads the fleet's gpu process
  resolves (``VOICY_WORKER_CPU_THREADS`` auto) and passes the engine's own
  options (``workers.transcribe.whisper.decode_options``). The process per
  job (Voicy's adapter) does the same in a fresh interpreter per file.
* **Warm on both sides.** The fleet runs two warm-up jobs (its model loads
  on the first); direct transcribes the same two files before it is timed.
* **Started alike.** Direct and every process-per-job run are processes in a
  session of their own, as each fleet process is: with the scheduler's
  autogroups, CPU is shared between sessions first, so a baseline inside the
  bench's own session (where the dev servers run) was scheduled differently
  from the fleet's gpu process.
* **Production fleet.** The Procfile's ``voicy_bridge``, ``io``, ``gpu`` and
  ``beat`` lines with every interval at its production default
  (``bench.voicy_rig``).

Fleet time is the first claim to the last completion (the server's own
timestamps); the pickup before the first claim (up to one poll interval,
Voicy's workers poll) is reported on its own. The fleet's transcripts are
compared with direct's, word for word (normalised words, ``bench.words``):
the same model with the same options must give the same words.

``fleet_over_direct`` ≤ 1.05 is issue 15's target, on every repeat;
``speedup_over_process_per_job`` can never exceed ``ceiling`` (process per
job ÷ direct) of the same repeat, and the bench checks that it does not.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

from bench.recordings import speech_fixtures
from bench.voicy_costs import gpu_slot_gaps
from bench.voicy_rig import RIG, Direct, FleetRig, fleet_threads, process_per_job
from bench.words import score
from devstack.infra.stack import AUDIO_DIR

DEFAULT_JOBS = 20
DEFAULT_REPEATS = 3
MIN_REPEATS = 3
WARM_UP_JOBS = 2
FLEET, DIRECT, PROCESS = "fleet", "direct", "process_per_job"
SIDES = (FLEET, DIRECT, PROCESS)
FLEET_OVER_DIRECT_TARGET = 1.05


def bench_files(jobs: int) -> list[Path]:
    """The speech fixtures in rotation (2.7 s to 35.6 s of audio)."""
    items = speech_fixtures()
    return [AUDIO_DIR / items[i % len(items)]["file"] for i in range(jobs)]


def _spread(values: list[float], digits: int = 3) -> dict[str, float]:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


def _cpu_delta(before: dict[str, float], after: dict[str, float], jobs: int) -> dict[str, float]:
    """CPU ms per job of each process type over a burst."""
    return {name: round(1000 * (after.get(name, 0.0) - before.get(name, 0.0)) / jobs, 1) for name in after}


def _one_repeat(r: int, rig: FleetRig, direct: Direct, files: list[Path], threads: int) -> dict[str, object]:
    order = SIDES[r % len(SIDES):] + SIDES[:r % len(SIDES)]
    figures: dict[str, object] = {"order": list(order), "load_avg_1m": round(os.getloadavg()[0], 2)}
    for side in order:
        if side == FLEET:
            before = rig.cpu_seconds()
            burst = rig.run(files)
            figures["fleet_s"] = round(burst.processing_s, 3)
            figures["pickup_s"] = round(burst.pickup_s, 3)
            figures["fleet_cpu_ms_per_job"] = cpu = _cpu_delta(before, rig.cpu_seconds(), len(files))
            figures["gpu_slot"] = gpu_slot_gaps(rig.events.take(), set(burst.job_ids))
            fleet_texts = burst.texts
        elif side == DIRECT:
            out = direct.run(files)
            figures["direct_s"] = round(out["wall_s"], 3)
            figures["direct_cpu_ms_per_job"] = round(1000 * out["cpu_s"] / len(files), 1)
            direct_texts = out["texts"]
        else:
            wall, timings = process_per_job(files, threads)
            figures["process_per_job_s"] = round(wall, 3)
            figures["process_startup_s_median"] = round(statistics.median(t[0] for t in timings), 3)
    figures["fleet_over_direct"] = round(figures["fleet_s"] / figures["direct_s"], 3)  # type: ignore[operator]
    # CPU seconds are far less moved by other tenants than wall time: the fleet's own processes, and with
    # the rig (the dev Voicy API and fake Telegram: Voicy's side, elsewhere in production), per job.
    fleet_cpu = sum(v for k, v in cpu.items() if k != RIG)
    figures["fleet_cpu_over_direct_cpu"] = round(fleet_cpu / figures["direct_cpu_ms_per_job"], 3)  # type: ignore[operator]
    figures["fleet_and_rig_cpu_over_direct_cpu"] = round(
        (fleet_cpu + cpu[RIG]) / figures["direct_cpu_ms_per_job"], 3)  # type: ignore[operator]
    figures["speedup_over_process_per_job"] = round(
        figures["process_per_job_s"] / figures["fleet_s"], 3)  # type: ignore[operator]
    figures["ceiling"] = round(figures["process_per_job_s"] / figures["direct_s"], 3)  # type: ignore[operator]
    differing = [i for i, (a, b) in enumerate(zip(fleet_texts, direct_texts)) if score(b, a).wer > 0]
    figures["jobs_whose_words_differ_from_direct"] = differing
    return figures


def run(jobs: int = DEFAULT_JOBS, repeats: int = DEFAULT_REPEATS) -> dict[str, object]:
    if repeats < MIN_REPEATS:
        raise ValueError(f"--repeats must be at least {MIN_REPEATS}")
    files = bench_files(jobs)
    threads = fleet_threads()
    with tempfile.TemporaryDirectory(prefix="sy-bench-voicy-") as tmp:
        rig = FleetRig(Path(tmp))
        direct = Direct(threads, files[:WARM_UP_JOBS])
        try:
            rig.run(files[:WARM_UP_JOBS])
            idle = rig.idle_cpu_ms_per_s()
            per_repeat = [_one_repeat(r, rig, direct, files, threads) for r in range(repeats)]
        finally:
            direct.close()
            rig.close()
    ratios = [float(p["fleet_over_direct"]) for p in per_repeat]  # type: ignore[arg-type]
    return {
        "jobs": jobs, "repeats": repeats, "cores": len(os.sched_getaffinity(0)), "cpu_threads": threads,
        "fleet_s": _spread([float(p["fleet_s"]) for p in per_repeat]),  # type: ignore[arg-type]
        "direct_s": _spread([float(p["direct_s"]) for p in per_repeat]),  # type: ignore[arg-type]
        "process_per_job_s": _spread([float(p["process_per_job_s"]) for p in per_repeat]),  # type: ignore[arg-type]
        "fleet_over_direct": _spread(ratios),
        "fleet_over_direct_target_met_every_repeat": all(r <= FLEET_OVER_DIRECT_TARGET for r in ratios),
        "fleet_cpu_over_direct_cpu": _spread([float(p["fleet_cpu_over_direct_cpu"]) for p in per_repeat]),  # type: ignore[arg-type]
        "fleet_and_rig_cpu_over_direct_cpu": _spread(
            [float(p["fleet_and_rig_cpu_over_direct_cpu"]) for p in per_repeat]),  # type: ignore[arg-type]
        "speedup_over_process_per_job": _spread(
            [float(p["speedup_over_process_per_job"]) for p in per_repeat]),  # type: ignore[arg-type]
        "ceiling": _spread([float(p["ceiling"]) for p in per_repeat]),  # type: ignore[arg-type]
        "speedup_within_ceiling_every_repeat": all(
            float(p["speedup_over_process_per_job"]) <= float(p["ceiling"]) for p in per_repeat),  # type: ignore[arg-type]
        "idle_cpu_ms_per_s": idle,
        "per_repeat": per_repeat,
    }


def run_rss(jobs: int = 200) -> dict[str, float]:
    """RSS of the gpu pool child over ``jobs`` jobs, after one warm-up pass over every fixture.

    The warm-up touches every audio length once, so allocator high-water marks
    (glibc keeps freed buffers) are in the baseline; what grows after that is a leak.
    """
    n_fixtures = len(speech_fixtures())
    with tempfile.TemporaryDirectory(prefix="sy-bench-rss-") as tmp:
        rig = FleetRig(Path(tmp))
        try:
            rig.run(bench_files(n_fixtures))
            first = rig.gpu_child_rss()
            rig.run(bench_files(jobs // 2))
            middle = rig.gpu_child_rss()
            rig.run(bench_files(jobs - jobs // 2))
            last = rig.gpu_child_rss()
        finally:
            rig.close()
    return {"jobs": jobs, "rss_after_warmup_mb": round(first / 2**20, 1),
            "rss_after_half_mb": round(middle / 2**20, 1), "rss_after_all_mb": round(last / 2**20, 1),
            "growth": round(last / first - 1, 4)}
