"""``python -m bench chaos``: kill the fleet at random while jobs flow, then count what survived.

1. Start the dev stack and the Procfile fleet under a supervisor (``bench.chaos_rig``),
   and run one warm-up job per side through it.
2. Open the window (``--window-s``): the load is fed evenly over its first
   ``FEED_SPAN_FRACTION``; every ``--kill-every-s`` (±50 %, seeded) one fleet
   process is SIGKILLed, picked at random among: either bridge, a worker's
   main process, a worker's pool child, beat. Redis is restarted once and
   NATS once, at seeded moments of the window.
3. Wait, bounded (``--quiesce-s``), until every job is final and the pool's
   consumers hold nothing (then ``SETTLE_S`` more, so a late duplicate is seen).
4. Count from the dev servers' records (``bench.chaos_count``), check that
   every dyno runs, print one summary line and write docs/RELIABILITY.md.
5. Read every dyno's log against the log budget (``bench.chaos_budget``): the
   outage and recovery lines the faults provoke are allowed by name, anything
   else is a finding and misses the targets like a lost job.

Everything runs on loopback and stops by itself: every wait has a bound.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench import chaos_budget, chaos_count, chaos_report
from bench.chaos_rig import FEED_SPAN_FRACTION, RESTART_CHECK_S, ChaosRig, is_celery_worker
from devstack.infra.supervisor import Dyno, Supervisor

DEFAULT_SEED = 1
DEFAULT_WINDOW_S = 300.0
DEFAULT_VOICY_JOBS = 60
DEFAULT_CAIRN_JOBS = 300
DEFAULT_KILL_EVERY_S = 6.0
DEFAULT_QUIESCE_S = 300.0
KILL_JITTER = 0.5  # each gap is kill_every_s x uniform(1 - j, 1 + j)
REDIS_RESTART_AT = (0.25, 0.40)  # fractions of the window, seeded uniform
NATS_RESTART_AT = (0.55, 0.70)
QUIESCE_POLL_S = 2.0
SETTLE_S = 5.0
ORPHAN_AFTER_S = 60.0  # an orphaned Voicy claim (an inherent window) this old no longer holds quiescence
PICK_ATTEMPTS = 10


def targets(sup: Supervisor) -> list[tuple[tuple[str, ...], str]]:
    """What a kill can hit, each equally likely: every process type that is not a Celery worker (both
    bridges, beat) on its own; a worker's main process; a worker's pool child."""
    kinds = list(dict.fromkeys(d.kind for d in sup.dynos))
    workers = tuple(k for k in kinds if is_celery_worker(sup.procfile[k]))
    return [*(((k,), "main") for k in kinds if k not in workers), (workers, "main"), (workers, "child")]


@dataclass
class ChaosLog:
    kills: list[dict[str, Any]] = field(default_factory=list)
    infra: list[dict[str, Any]] = field(default_factory=list)


def _pick(rng: random.Random, sup: Supervisor) -> tuple[Dyno, psutil.Process, str] | None:
    choices = targets(sup)
    for _ in range(PICK_ATTEMPTS):
        kinds, which = rng.choice(choices)
        dynos = [d for d in sup.dynos if d.kind in kinds and d.alive and d.restart_at is None]
        if not dynos:
            continue
        dyno = rng.choice(dynos)
        if which == "main":
            proc = dyno.main_process()
        else:
            children = dyno.pool_children()
            proc = rng.choice(children) if children else None
        if proc is not None:
            return dyno, proc, f"{dyno.name} {which}"
    return None


def kill_one(rng: random.Random, rig: ChaosRig, log: ChaosLog, t0: float) -> None:
    assert rig.supervisor is not None
    sup = rig.supervisor
    picked = _pick(rng, sup)
    if picked is None:
        return
    dyno, proc, what = picked
    if what.endswith("main"):
        sup.mark_killed(dyno)
    try:
        proc.send_signal(signal.SIGKILL)
    except psutil.Error:
        return
    log.kills.append({"t": round(time.monotonic() - t0, 1), "target": what, "pid": proc.pid,
                      **in_flight(rig)})


def in_flight(rig: ChaosRig) -> dict[str, int]:
    """What was in flight when a kill landed (so the report can show kills mid-download/transcription),
    and how many live presence records core saw for the pool (C5: it must never drop to 0)."""
    statuses = Counter(rig.voicy_api.get_job(j.job_id)["status"] for j in rig.voicy if j.job_id)
    try:
        cairn = sum(c["num_ack_pending"] for c in chaos_count.pool_consumers(rig))
        presence = len(rig.core.live_presence(rig.pool))
    except Exception:  # noqa: BLE001 - NATS is being restarted
        cairn = presence = -1
    return {"voicy_downloading": statuses["downloading"], "voicy_transcribing": statuses["transcribing"],
            "cairn_in_flight": cairn, "cairn_live_presence": presence}


def run_window(rig: ChaosRig, rng: random.Random, window_s: float, kill_every_s: float) -> ChaosLog:
    """Feed the load and inject the faults for ``window_s``; returns what was done when."""
    assert rig.supervisor is not None
    log = ChaosLog()
    t0 = time.monotonic()
    rig.feed(window_s * FEED_SPAN_FRACTION)
    redis_at = t0 + window_s * rng.uniform(*REDIS_RESTART_AT)
    nats_at = t0 + window_s * rng.uniform(*NATS_RESTART_AT)
    next_kill = t0 + kill_every_s * rng.uniform(1 - KILL_JITTER, 1 + KILL_JITTER)
    end = t0 + window_s
    while (now := time.monotonic()) < end:
        if redis_at and now >= redis_at:
            rig.restart_redis()
            log.infra.append({"t": round(redis_at - t0, 1), "what": "redis restart",
                              "down_s": round(time.monotonic() - redis_at, 1)})
            redis_at = 0.0
        elif nats_at and now >= nats_at:
            rig.restart_nats()
            log.infra.append({"t": round(nats_at - t0, 1), "what": "nats restart",
                              "down_s": round(time.monotonic() - nats_at, 1)})
            nats_at = 0.0
        elif now >= next_kill:
            kill_one(rng, rig, log, t0)
            next_kill = now + kill_every_s * rng.uniform(1 - KILL_JITTER, 1 + KILL_JITTER)
        wake = min(redis_at or end, nats_at or end, next_kill, end)
        time.sleep(max(0.0, min(wake - time.monotonic(), 1.0)))  # the schedule's own clock
    return log


def quiesce(rig: ChaosRig, bound_s: float) -> tuple[float, bool]:
    """Wait until every job is final (or an old orphaned Voicy claim, an inherent window) and the
    consumers are idle, ``SETTLE_S`` in a row; (seconds, quiet)."""
    started = time.monotonic()
    rig.join_feeder(bound_s)
    quiet_since: float | None = None
    while time.monotonic() - started < bound_s:
        voicy_done = chaos_count.voicy_settled(rig, ORPHAN_AFTER_S)
        try:
            quiet = voicy_done and chaos_count.cairn_quiet(rig)
        except Exception:  # noqa: BLE001 - the core is reconnecting; ask again
            quiet = False
        if quiet:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= SETTLE_S:
                return time.monotonic() - started, True
        else:
            quiet_since = None
        time.sleep(QUIESCE_POLL_S)  # the dev servers' records: no event to await from here
    return time.monotonic() - started, False


def dynos_down(sup: Supervisor) -> list[str]:
    """Dynos not running at the end; each gets ``RESTART_CHECK_S`` to come back first."""
    deadline = time.monotonic() + RESTART_CHECK_S
    while sup.down() and time.monotonic() < deadline:
        time.sleep(QUIESCE_POLL_S)
    return [d.name for d in sup.down()]


def run(*, seed: int, window_s: float, voicy_jobs: int, cairn_jobs: int, kill_every_s: float,
        quiesce_s: float, write_doc: bool = True, command: str = "") -> dict[str, Any]:
    started = time.monotonic()
    run_commit = chaos_report.commit()  # before the run: the doc it writes dirties the tree
    workdir = Path(tempfile.mkdtemp(prefix="sy-chaos-"))
    rng = random.Random(seed)
    rig = ChaosRig(workdir, seed, voicy_jobs, cairn_jobs)
    keep = True  # until the figures say otherwise: a run that fails keeps its logs
    try:
        rig.start()
        assert rig.supervisor is not None
        warm_s = rig.wait_ready()
        rig.prepare_load()
        setup_s = time.monotonic() - started
        log = run_window(rig, rng, window_s, kill_every_s)
        quiet_s, quiet = quiesce(rig, quiesce_s)
        voicy = chaos_count.count_voicy(rig)
        cairn = chaos_count.count_cairn(rig)
        down = dynos_down(rig.supervisor)
        crashes = [{"dyno": e.dyno, "rc": e.returncode} for e in rig.supervisor.crash_exits()]
        restarts = sum(d.starts - 1 for d in rig.supervisor.dynos)
        keep = bool(voicy.lost or voicy.stuck or voicy.duplicates or cairn.lost or cairn.stuck
                    or cairn.duplicates or down)
    except BaseException:
        print(f"chaos run failed; fleet logs kept in {workdir}", file=sys.stderr, flush=True)
        raise
    finally:
        rig.stop()
        budget = chaos_budget.scan(d.log_path for d in (rig.supervisor.dynos if rig.supervisor else []))
        keep = keep or not budget.empty  # a finding keeps the logs it names
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    figures = {
        "seed": seed, "command": command, "commit": run_commit, "window_s": window_s, "kill_every_s": kill_every_s,
        "voicy_jobs": voicy_jobs, "cairn_jobs": cairn_jobs, "quiesce_bound_s": quiesce_s,
        "lost": len(voicy.lost) + len(cairn.lost),
        "duplicate_executions": len(voicy.duplicates) + len(cairn.duplicates),
        "failed": sum(voicy.failed.values()) + sum(cairn.failed.values()),
        "stuck": len(voicy.stuck) + len(cairn.stuck),
        "crashed_not_restarted": len(down), "down_at_end": down,
        "self_exits": len(crashes), "self_exit_detail": crashes,
        "kills": len(log.kills), "kill_log": log.kills, "infra": log.infra, "restarts": restarts,
        "voicy": voicy.as_dict(), "cairn": cairn.as_dict(),
        "quiet": quiet, "setup_s": round(setup_s, 1), "warmup_s": round(warm_s, 1),
        "quiescence_s": round(quiet_s, 1), "total_s": round(time.monotonic() - started, 1),
        "kept_workdir": str(workdir) if keep else None, "loadavg": [round(x, 2) for x in os.getloadavg()],
        "log_budget": chaos_budget.figures(budget),
    }
    print(chaos_report.summary_line(figures), flush=True)
    print(budget.report(), flush=True)
    if keep:
        print(f"fleet logs kept for a post-mortem in {workdir}", flush=True)
    if write_doc:
        chaos_report.write_reliability(figures)
    return figures


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench chaos",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                     description="SIGKILL fleet processes at random while jobs flow; count "
                                                 "lost, duplicated, failed and stuck jobs.")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="random seed of the load and the faults")
    parser.add_argument("--window-s", type=float, default=DEFAULT_WINDOW_S, help="fault window, seconds")
    parser.add_argument("--voicy-jobs", type=int, default=DEFAULT_VOICY_JOBS,
                        help="voice messages of 5-20 s of speech")
    parser.add_argument("--cairn-jobs", type=int, default=DEFAULT_CAIRN_JOBS,
                        help="fetch_source jobs (fake Strava ~250 ms a call)")
    parser.add_argument("--kill-every-s", type=float, default=DEFAULT_KILL_EVERY_S,
                        help="mean seconds between SIGKILLs")
    parser.add_argument("--quiesce-s", type=float, default=DEFAULT_QUIESCE_S,
                        help="bound on the wait for quiescence after the window, seconds")
    parser.add_argument("--no-doc", action="store_true", help="do not write docs/RELIABILITY.md")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    args = parser.parse_args(argv)
    given = argv if argv is not None else sys.argv[2:]
    command = " ".join(["python -m bench chaos", *(shlex.quote(a) for a in given)])
    if "--seed" not in given:
        command += f" --seed {args.seed}"
    quiet_libraries()
    figures = run(seed=args.seed, window_s=args.window_s, voicy_jobs=args.voicy_jobs, cairn_jobs=args.cairn_jobs,
               kill_every_s=args.kill_every_s, quiesce_s=args.quiesce_s, write_doc=not args.no_doc,
               command=command.strip())
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    return figures


def quiet_libraries() -> None:
    """The in-process dev servers' clients log every NATS/Redis outage with a traceback; the faults are
    the point of the run, so only errors of the harness itself reach the terminal."""
    logging.basicConfig(level=logging.ERROR)
    for name in ("nats", "devstack", "uvicorn", "uvicorn.error"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def targets_met(figures: dict[str, Any]) -> bool:
    """0 lost, 0 duplicate executions, 0 stuck, 0 crashed-and-not-restarted, 0 unexplained log lines."""
    return not (figures["lost"] or figures["duplicate_executions"] or figures["stuck"]
                or figures["crashed_not_restarted"] or figures.get("log_budget", {}).get("unexplained"))
