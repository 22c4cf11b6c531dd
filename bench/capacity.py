"""Capacity: how far one bridge, one Redis and the fleet's own machinery go (issue 15 §4).

``python -m bench capacity [--jobs N] [--side cairn|voicy|both]``. Both sides run
the Procfile's own lines at their production settings, with plug-ins whose own
work takes no time (``bench/plugins/switchyard_null.py``, installed as a
distribution of their own through the ``switchyard.providers`` and
``switchyard.engines`` entry points):

* **Cairn**: ``cairn_bridge`` and ``provider`` (prefork ``-c 8``, INFO logs) of a
  pool of the ``null`` provider, over the bench's Cairn rig (NATS, the dev core,
  moto S3 in its own process, Redis). A job is what the fleet does around any
  provider: the bridge pulls, grants the lease and sends ``cairn.job``; the task
  takes the lease, gets the job's tokens from core, publishes the claim-checked
  result (presign, PUT, envelope), records the outcome; the bridge acks.
* **Voicy**: ``voicy_bridge``, ``io``, ``gpu`` and ``beat`` at production
  intervals (``bench.voicy_rig``) with ``VOICY_WORKER_TRANSCRIBER=null``: the
  bridge claims, ``io`` fetches the file from the fake Telegram into the media
  store, ``gpu`` posts ``/transcribe`` and the result.

Each side warms up, then runs one burst of ``N`` jobs published at once. Reported
per side: jobs/s on this box, and the CPU milliseconds per job of every process
(psutil, user + system); for the Cairn pool also what its processes cost with no job
(CPU ms per second and resident memory over ``IDLE_WINDOW_S`` after the burst). From
the CPU figures follow the capacities that do not depend on this box's two cores
being shared by everything: a bridge is one process whose work holds the GIL, so
it cannot pass ``1000 / its ms per job`` jobs/s on one core; Redis is single-threaded, so the same holds for it; a
worker instance has as many cores as its host. docs/BENCHMARKS.md
"Capacity planning" turns these into how many GPU hosts and provider pools one
bridge feeds.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.cairn_bench import IDLE_JOBS, Rig, cpu_parts, machine, ms_per_job
from bench.plugins import NULL, NullKit, install_null
from bench.recordings import speech_fixtures
from bench.voicy_rig import FleetRig
from devstack.infra import procfile
from devstack.infra.procs import Proc
from devstack.infra.stack import AUDIO_DIR
from workers.providers.kinds import FETCH_SOURCE

DEFAULT_CAIRN_JOBS = 600
DEFAULT_VOICY_JOBS = 200
WARM_UP_JOBS = 8
READY_TIMEOUT_S = 120.0
BURST_TIMEOUT_S = 900.0
CAIRN_LINES = ("cairn_bridge", "provider")  # the Procfile's lines of one Cairn pool
# After the burst, the pool's processes with no job: what a pool costs a host while its budget is spent
# (its pull loops poll every FETCH_WAIT_S per consumer, presence and liveness renew on their timers).
IDLE_WINDOW_S = 30.0
MS_PER_S = 1000.0


def per_core(ms_per_job: float) -> float | None:
    """Jobs per second one core sustains at ``ms_per_job`` of CPU each."""
    return round(MS_PER_S / ms_per_job, 1) if ms_per_job > 0 else None


# --------------------------------------------------------------------------- Cairn
def _rss_mib(proc: Proc) -> float:
    """Resident memory of a line's processes (its shell, the process and any pool children; pages
    a prefork pool shares with its parent count once per process, so a pool's figure is an upper bound)."""
    try:
        root = psutil.Process(proc.proc.pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20
    except psutil.Error:
        return 0.0


def _cairn_fleet(rig: Rig) -> dict[str, Proc]:
    logs = rig.workdir / "logs"
    logs.mkdir(exist_ok=True)
    env = rig.stack.env(rig.pool)
    # node names as honcho sets them (DYNO would mean Heroku)
    return {name: procfile.run(name, {**env, "HONCHO_PROCESS_NAME": f"{name}.1"}, logs / f"{name}.log")
            for name in CAIRN_LINES}


def cairn(jobs: int, workdir: Path, site: Path) -> dict[str, Any]:
    rig = Rig(workdir / "cairn", fake=NullKit(site))
    rig.workdir.mkdir(parents=True)
    rig.start()
    fleet: dict[str, Proc] = {}
    try:
        warm, solo, measured = rig.make_jobs(WARM_UP_JOBS, "w"), rig.make_jobs(IDLE_JOBS, "s"), rig.make_jobs(jobs, "c")
        fleet = _cairn_fleet(rig)
        for job in warm:
            rig.core.enqueue_job(FETCH_SOURCE, job)
        warm_ids = {j["job_id"] for j in warm}
        try:
            rig.core.router.wait(lambda: warm_ids <= rig.ingested_at.keys(), READY_TIMEOUT_S, "cairn warm-up")
        except TimeoutError:
            raise RuntimeError("the Cairn fleet never completed its warm-up:\n" + "\n".join(
                f"--- {n}\n{p.log()[-3000:]}" for n, p in fleet.items())) from None
        idle = rig.solo_latency(solo)
        side_before = {k: v for p in fleet.values() for k, v in cpu_parts(p).items()}
        rig_before = rig.cpu_parts()
        figures = rig.burst(measured, BURST_TIMEOUT_S)
        side_after = {k: v for p in fleet.values() for k, v in cpu_parts(p).items()}
        side = ms_per_job(side_before, side_after, jobs)
        rig_ms = ms_per_job(rig_before, rig.cpu_parts(), jobs)
        time.sleep(IDLE_WINDOW_S)  # a window to measure over, not a wait for an event
        idle_cpu = {name: round((v - side_after.get(name, 0.0)) * MS_PER_S / IDLE_WINDOW_S, 2) for name, v in
                    {k: v for p in fleet.values() for k, v in cpu_parts(p).items()}.items()}
        idle_rss = {name: round(_rss_mib(p), 1) for name, p in fleet.items()}
    finally:
        for proc in fleet.values():
            proc.stop()
        rig.stop()
    parts = {"bridge": side.get("cairn_bridge", 0.0), "provider main": side.get("provider", 0.0),
             "provider pool": side.get("provider children", 0.0), "redis-server": rig_ms.get("redis-server", 0.0),
             "nats-server": rig_ms.get("nats-server", 0.0),
             "rig: core + moto": round(rig_ms.get("core + fake Strava (bench process)", 0.0)
                                       + rig_ms.get("moto", 0.0), 1)}
    return {"jobs": jobs, "jobs_per_s_on_this_box": figures["jobs_per_s"], "latency_ms": figures["latency_ms"],
            "idle_latency_ms": idle, "results_ingested": figures["results_ingested"],
            "results_from_redeliveries": figures["results_from_redeliveries"], "cpu_ms_per_job": parts,
            "idle_cpu_ms_per_s": idle_cpu, "idle_rss_mib": idle_rss,
            "one_core_jobs_per_s": {"bridge": per_core(parts["bridge"]), "redis": per_core(parts["redis-server"]),
                                    "provider instance": per_core(parts["provider main"] + parts["provider pool"])}}


# --------------------------------------------------------------------------- Voicy
def voicy(jobs: int, workdir: Path, site: Path) -> dict[str, Any]:
    shortest = min((AUDIO_DIR / m["file"] for m in speech_fixtures()),
                   key=lambda p: p.stat().st_size)  # the engine never reads it; io downloads it
    rig = FleetRig(workdir / "voicy", extra_env={"VOICY_WORKER_TRANSCRIBER": NULL, "PYTHONPATH": str(site)})
    try:
        rig.run([shortest] * WARM_UP_JOBS)
        before = rig.cpu_seconds()
        started = time.monotonic()
        burst = rig.run([shortest] * jobs)
        wall = time.monotonic() - started
        after = rig.cpu_seconds()
    finally:
        rig.close()
    ms = {name: round((after[name] - before.get(name, 0.0)) * MS_PER_S / jobs, 2) for name in after}
    return {"jobs": jobs, "jobs_per_s_on_this_box": round(jobs / burst.processing_s, 1),
            "burst_wall_s": round(wall, 1), "pickup_s": round(burst.pickup_s, 2), "cpu_ms_per_job": ms,
            "one_core_jobs_per_s": {"bridge": per_core(ms.get("voicy_bridge", 0.0)),
                                    "redis": per_core(ms.get("redis", 0.0)),
                                    "io instance": per_core(ms.get("io main", 0.0) + ms.get("io pool", 0.0))}}


def run(jobs: int | None = None, side: str = "both") -> dict[str, Any]:
    """``python -m bench capacity``: the figures of one or both sides, JSON-able."""
    workdir = Path(tempfile.mkdtemp(prefix="sy-capacity-"))
    info = machine()
    started = time.monotonic()
    try:
        site = install_null(workdir / "site-packages")
        out: dict[str, Any] = {"benchmark": "capacity with null work (issue 15 §4)", "machine": info,
                               "cores": len(os.sched_getaffinity(0)), "cpu_count": psutil.cpu_count()}
        if side in ("cairn", "both"):
            out["cairn"] = cairn(jobs or DEFAULT_CAIRN_JOBS, workdir, site)
        if side in ("voicy", "both"):
            out["voicy"] = voicy(jobs or DEFAULT_VOICY_JOBS, workdir, site)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out["run_s"] = round(time.monotonic() - started, 1)
    return out
