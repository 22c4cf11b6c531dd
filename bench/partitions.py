"""``python -m bench partitions``: cut hosts of the fleet off the network mid-job, heal, count (R2).

The fleet runs on hosts (``bench.partitions_rig``: network namespaces, one
address, hostname, pid numbering and ``/tmp`` each, S3 the only shared storage).
Each partition below lands while its own jobs are in flight, lasts a fixed time,
heals, and is then judged on its own jobs, from the dev servers' records as
``bench chaos`` counts them (``bench.chaos_count``):

=====================  ======================================================  ==============
partition              how                                                     lasts
=====================  ======================================================  ==============
gpu-link               the gpu host transcribing a long voice: link down       lease TTL + 5 s
provider-nats          the provider host, mid fetch_source: DROP to NATS       AckWait + 5 s
voicy-bridge-redis     the Voicy bridge, jobs in flight: DROP to Redis         ``OUTAGE_S``
cairn-bridge-nats      the Cairn bridge, messages held: DROP to NATS           AckWait + 5 s
beat-redis             beat, a transcription and Cairn jobs in flight: DROP    ``OUTAGE_S``
=====================  ======================================================  ==============

Targets: 0 lost, 0 duplicate (outside docs/RELIABILITY.md's inherent windows), 0
stuck, and every process healthy again (``switchyard health``) within
``HEALTHY_BOUND_S`` of the heal. The gpu-link partition also checks that the cut
host's late ``/result`` was refused or never sent: the job is recovered by the
other gpu host, once.

Every wait has a bound, and the hosts are removed whatever happens.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import chaos_budget, chaos_count, chaos_report, partitions_budget, partitions_report
from bench.chaos import quiet_libraries
from bench.chaos_rig import CAIRN_ACK_WAIT_S, VOICY_LEASE_TTL_MS, CairnJob, VoicyJob
from bench.partitions_rig import CORE, PLACEMENT, HostsRig
from devstack.fakes.synth_media import SpeechSynth

CUT_MARGIN_S = 5.0  # a partition outlasts the timeout it is about by this much
OUTAGE_S = 20.0  # a bridge's or beat's cut from one service (R1: up to a minute must be ridden out)
LONG_VOICE_S = 60.0  # the gpu-link job: long enough that the cut lands mid-transcription
VOICE_S = 8.0
CAIRN_JOBS = 8  # per Cairn partition: more than the provider's slots, so some are always in flight
MID_JOB_BOUND_S = 90.0  # the wait for a partition's jobs to be in flight
SETTLE_BOUND_S = 180.0  # the wait, after the heal, for a partition's jobs to be final
SETTLE_S = 10.0  # then this much longer, so a late result or duplicate is seen
HEALTHY_BOUND_S = 60.0  # target: every process healthy within this long of the heal
HEALTH_POLL_S = 1.0
POLL_S = 0.1
GPU_CALLS = ("transcribe", "job", "progress")  # what a gpu host asks Voicy about a job it holds
PARTITIONS = ("gpu-link", "provider-nats", "voicy-bridge-redis", "cairn-bridge-nats", "beat-redis")
SHORT = ("gpu-link", "provider-nats")  # one per side: what `make test` runs


@dataclass
class Outcome:
    """What one partition did to its own jobs."""

    name: str
    how: str
    down_s: float
    voicy: list[VoicyJob] = field(default_factory=list)
    cairn: list[CairnJob] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    settle_s: float = 0.0
    healthy_s: float | None = None
    counts: dict[str, Any] = field(default_factory=dict)

    def figures(self) -> dict[str, Any]:
        return {"name": self.name, "how": self.how, "down_s": self.down_s, "settle_s": round(self.settle_s, 1),
                "healthy_s": None if self.healthy_s is None else round(self.healthy_s, 1), **self.counts,
                **self.notes}


def wait_for(predicate: Callable[[], bool], bound_s: float, what: str) -> float:
    """Poll ``predicate`` (the dev servers' records: no event to await across processes); seconds taken."""
    started = time.monotonic()
    while time.monotonic() - started < bound_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(POLL_S)
    raise TimeoutError(f"{what}: not within {bound_s:.0f} s")


# --- load ------------------------------------------------------------------------------------------
def voice(rig: HostsRig, tag: str, seconds: float, rng: random.Random) -> VoicyJob:
    """One voice message of about ``seconds`` of speech, enqueued at Voicy."""
    media = rig.workdir / "voices"
    media.mkdir(exist_ok=True)
    path = media / f"{tag}.ogg"
    duration, _ = SpeechSynth().write_ogg(path, seconds, rng)
    rig.telegram.add_file(tag, path.read_bytes())
    job = VoicyJob("", tag, duration)
    rig._enqueue_voicy(job)
    return job


def cairn_jobs(rig: HostsRig, tag: str, n: int = CAIRN_JOBS) -> list[CairnJob]:
    jobs = rig._make_cairn(n, tag)
    for job in jobs:
        rig._publish(job)
    return jobs


def status(rig: HostsRig, job: VoicyJob) -> str:
    return str(rig.voicy_api.get_job(job.job_id)["status"])


def cairn_in_flight(rig: HostsRig) -> bool:
    return sum(c["num_ack_pending"] for c in chaos_count.pool_consumers(rig)) > 0


def transcribing_host(rig: HostsRig, job: VoicyJob, endpoints: tuple[str, ...] = GPU_CALLS) -> str | None:
    """The gpu host that last sent Voicy one of ``endpoints`` about the job (its ``/transcribe``, the
    ``GET`` after a 404, a ``/progress``): the host holding the job's transcription; None before any.
    The first of them, not a ``/progress``: the batched engine posts its progress late, with the result."""
    gpu = {rig.host(h).address: h for h in PLACEMENT["gpu"]}
    peers = [r["peer"] for r in rig.voicy_api.requests
             if r.get("job_id") == job.job_id and r.get("endpoint") in endpoints and r["peer"] in gpu]
    return gpu[peers[-1]] if peers else None


# --- partitions --------------------------------------------------------------------------------------
def gpu_link(rig: HostsRig, rng: random.Random) -> Outcome:
    down_s = VOICY_LEASE_TTL_MS / 1000 + CUT_MARGIN_S
    job = voice(rig, "part-gpu", LONG_VOICE_S, rng)
    wait_for(lambda: transcribing_host(rig, job) is not None, MID_JOB_BOUND_S, "the long voice transcribing")
    host = transcribing_host(rig, job)
    assert host is not None
    out = Outcome("gpu-link", f"{host}: link down", down_s, voicy=[job])
    out.notes["cut_host"] = host
    out.notes["status_at_cut"] = status(rig, job)
    out.notes["cut_at"] = rig.voicy_api.state.now()
    rig.net.cut(host)  # type: ignore[union-attr]
    time.sleep(down_s)  # the partition itself
    rig.net.heal(host)  # type: ignore[union-attr]
    return out


def gpu_link_verdict(rig: HostsRig, out: Outcome) -> None:
    """The job is recovered once, by the other gpu host; the cut host's late ``/result`` (or ``/failure``:
    it would requeue a job handed on) is refused or never sent."""
    job = out.voicy[0]
    host = rig.host(out.notes["cut_host"]).address
    cut_at = out.notes.pop("cut_at")
    results = rig.voicy_api.requests_for("result", job.job_id)
    out.notes["results_accepted_from"] = [rig.host_by_address(r["peer"]) for r in results if r["status"] == 200]
    late = [f"{r['endpoint']} {r['status']}" for r in rig.voicy_api.requests
            if r.get("job_id") == job.job_id and r["peer"] == host and r["at"] >= cut_at
            and r.get("endpoint") in ("result", "failure")]
    out.notes["cut_host_late_posts"] = late
    others = [h for h in out.notes["results_accepted_from"] if h != rig.host_by_address(host)]
    out.notes["late_result_ok"] = not any(p.endswith(" 200") for p in late) and len(others) == 1
    if out.notes.get("status_at_cut") in chaos_count.FINAL_VOICY:
        out.notes["missed"] = "the job was final before the cut landed: nothing was partitioned mid-job"


def drop(rig: HostsRig, host: str, service: str, down_s: float, out: Outcome) -> Outcome:
    """Drop ``host``'s TCP to one core service (``redis``/``nats``) for ``down_s``, then heal."""
    port = rig.redis.port if service == "redis" else rig.nats.port
    rig.net.drop(host, rig.host(CORE).address, port)  # type: ignore[union-attr]
    time.sleep(down_s)  # the partition itself
    rig.net.undrop(host)  # type: ignore[union-attr]
    return out


def cairn_from_nats(rig: HostsRig, name: str, host: str, tag: str) -> Outcome:
    """``host`` DROPped from NATS while Cairn jobs are held, for longer than AckWait."""
    down_s = CAIRN_ACK_WAIT_S + CUT_MARGIN_S
    out = Outcome(name, f"{host}: DROP to NATS", down_s, cairn=cairn_jobs(rig, tag))
    wait_for(lambda: cairn_in_flight(rig), MID_JOB_BOUND_S, "Cairn jobs in flight")
    return drop(rig, host, "nats", down_s, out)


def provider_nats(rig: HostsRig, rng: random.Random) -> Outcome:
    return cairn_from_nats(rig, "provider-nats", "provider", "part-prov")


def voicy_bridge_redis(rig: HostsRig, rng: random.Random) -> Outcome:
    jobs = [voice(rig, f"part-vb-{i}", VOICE_S, rng) for i in range(3)]
    out = Outcome("voicy-bridge-redis", "vbridge: DROP to Redis", OUTAGE_S, voicy=jobs)
    wait_for(lambda: any(status(rig, j) != "queued" for j in jobs), MID_JOB_BOUND_S, "a voice claimed")
    return drop(rig, "vbridge", "redis", OUTAGE_S, out)


def cairn_bridge_nats(rig: HostsRig, rng: random.Random) -> Outcome:
    return cairn_from_nats(rig, "cairn-bridge-nats", "cbridge", "part-cb")


def beat_redis(rig: HostsRig, rng: random.Random) -> Outcome:
    job = voice(rig, "part-beat", LONG_VOICE_S / 2, rng)
    out = Outcome("beat-redis", "beat: DROP to Redis", OUTAGE_S, voicy=[job], cairn=cairn_jobs(rig, "part-beat"))
    wait_for(lambda: transcribing_host(rig, job) is not None, MID_JOB_BOUND_S, "the voice transcribing")
    return drop(rig, "beat", "redis", OUTAGE_S, out)


SCENARIOS: dict[str, Callable[[HostsRig, random.Random], Outcome]] = {
    "gpu-link": gpu_link, "provider-nats": provider_nats, "voicy-bridge-redis": voicy_bridge_redis,
    "cairn-bridge-nats": cairn_bridge_nats, "beat-redis": beat_redis,
}


# --- judging ---------------------------------------------------------------------------------------
def view(rig: HostsRig, out: Outcome) -> HostsRig:
    """The rig as ``chaos_count`` sees it, holding only this partition's jobs."""
    part = copy.copy(rig)
    part.voicy, part.cairn = out.voicy, out.cairn
    return part


def settled(rig: HostsRig, out: Outcome) -> bool:
    part = view(rig, out)
    voicy_done = all(status(rig, j) in chaos_count.FINAL_VOICY for j in out.voicy)
    try:
        return voicy_done and (not out.cairn or chaos_count.cairn_quiet(part))
    except Exception:  # noqa: BLE001 - core reconnecting to NATS: ask again
        return False


def health_argv() -> list[str] | None:
    """``switchyard health`` when this tree has the verb (issue 14 §1); else None."""
    try:
        import ops.health  # noqa: F401  # the verb lands with issue 14 §1
    except ImportError:
        return None
    return [sys.executable, "-m", "ops", "health"]


def healthy(rig: HostsRig, argv: list[str]) -> bool:
    done = subprocess.run(argv, env=rig.env, capture_output=True, text=True, timeout=HEALTHY_BOUND_S, check=False)
    return done.returncode == 0


def judge(rig: HostsRig, out: Outcome, healed_at: float) -> None:
    argv = health_argv()
    if argv is not None:
        try:
            wait_for(lambda: healthy(rig, argv), HEALTHY_BOUND_S * 2, "the fleet healthy again")
            out.healthy_s = time.monotonic() - healed_at
        except TimeoutError:
            out.healthy_s = None
            out.notes["unhealthy"] = True
    try:
        wait_for(lambda: settled(rig, out), SETTLE_BOUND_S, f"{out.name}: its jobs final")
        time.sleep(SETTLE_S)  # a late result or duplicate must have time to show
    except TimeoutError:
        out.notes["settled"] = False
    out.settle_s = time.monotonic() - healed_at
    part = view(rig, out)
    voicy, cairn = chaos_count.count_voicy(part), chaos_count.count_cairn(part)
    out.counts = {"lost": len(voicy.lost) + len(cairn.lost),
                  "lost_of_which_inherent": len(voicy.inherent) + len(cairn.inherent),
                  "duplicate": len(voicy.duplicates) + len(cairn.duplicates),
                  "failed": sum(voicy.failed.values()) + sum(cairn.failed.values()),
                  "stuck": len(voicy.stuck) + len(cairn.stuck),
                  "ids": {"lost": voicy.lost + cairn.lost, "duplicate": voicy.duplicates + cairn.duplicates,
                          "stuck": voicy.stuck + cairn.stuck}}
    if out.name == "gpu-link":
        gpu_link_verdict(rig, out)


def met(f: dict[str, Any]) -> bool:
    """A partition's targets: nothing lost, duplicated or stuck; healthy in time; the late result refused."""
    healthy_ok = not f.get("unhealthy") and (f["healthy_s"] is None or f["healthy_s"] <= HEALTHY_BOUND_S)
    return (not f["lost"] and not f["duplicate"] and not f["stuck"] and healthy_ok
            and f.get("late_result_ok", True) and f.get("settled", True) and not f.get("missed"))


def run(names: tuple[str, ...], seed: int) -> dict[str, Any]:
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="sy-parts-"))
    rig = HostsRig(workdir, seed, 0, 0)
    rng = random.Random(seed)
    results: list[dict[str, Any]] = []
    try:
        rig.start()
        warm_s = rig.wait_ready()
        setup_s = time.monotonic() - started
        across = warmup_hosts(rig)
        for name in names:
            out = SCENARIOS[name](rig, rng)
            judge(rig, out, time.monotonic())
            results.append(out.figures())
            print(f"partition {name}: {summary(results[-1])}", flush=True)
        down = [d.name for d in rig.supervisor.down()] if rig.supervisor else []
        crashes = [{"dyno": e.dyno, "rc": e.returncode} for e in rig.supervisor.crash_exits()] \
            if rig.supervisor else []
    except BaseException:
        print(f"partition run failed; fleet logs kept in {workdir}", file=sys.stderr, flush=True)
        raise
    finally:
        rig.stop()  # before the budget: it reads what the stop logged too
    assert rig.supervisor is not None
    budget = chaos_budget.figures(partitions_budget.scan(d.log_path for d in rig.supervisor.dynos))
    keep = not all(met(r) for r in results) or bool(down or crashes or budget["unexplained"])
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    figures = {"seed": seed, "partitions": results, "setup_s": round(setup_s, 1), "warmup_s": round(warm_s, 1),
               "total_s": round(time.monotonic() - started, 1), "down_at_end": down, "self_exits": crashes,
               "health_checked": health_argv() is not None, "kept_workdir": str(workdir) if keep else None,
               "log_budget": budget,
               "met": all(met(r) for r in results) and not down and not crashes and not budget["unexplained"],
               **across}
    return figures


def warmup_hosts(rig: HostsRig) -> dict[str, Any]:
    """Where the warm-up jobs ran: each dyno's host, the host behind each Voicy call, the Cairn
    results core ingested, and the hostname each Celery worker gave its node (``gpu.1@gpu1``)."""
    assert rig.supervisor is not None
    calls: dict[str, set[str]] = {}
    for r in rig.voicy_api.requests:
        if r.get("job_id") and r.get("status") == 200:
            calls.setdefault(r["endpoint"], set()).add(rig.host_by_address(r["peer"]) or str(r["peer"]))
    nodes = sorted({line.split("] ", 1)[1].split(" ")[0] for d in rig.supervisor.dynos
                    for line in d.log_path.read_text(errors="replace").splitlines() if " ready." in line
                    and "] " in line and "@" in line})
    return {"placement": {d.name: rig.host_of(d.name).name for d in rig.supervisor.dynos},
            "voicy_calls_by_host": {k: sorted(v) for k, v in calls.items()},
            "cairn_results_ingested": len(rig.core.ingested), "celery_nodes": nodes}


def summary(f: dict[str, Any]) -> str:
    healthy_s = "n/a" if f["healthy_s"] is None else f"{f['healthy_s']:g}s"
    extra = f" late_result_ok={f['late_result_ok']}" if "late_result_ok" in f else ""
    return (f"{f['how']} for {f['down_s']:g}s: lost={f['lost']} duplicate={f['duplicate']} stuck={f['stuck']} "
            f"failed={f['failed']} healthy_after={healthy_s} settled_after={f['settle_s']:g}s{extra}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench partitions",
                                     description="cut fleet hosts off the network mid-job; count lost, "
                                                 "duplicated and stuck jobs and the time back to healthy")
    parser.add_argument("--only", default=",".join(PARTITIONS),
                        help=f"comma-separated partitions to run, in order (of {', '.join(PARTITIONS)})")
    parser.add_argument("--short", action="store_true", help=f"one partition per side: {', '.join(SHORT)}")
    parser.add_argument("--smoke", action="store_true",
                        help="no partition: build the hosts and run one job per side across them")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    parser.add_argument("--no-doc", action="store_true", help="do not write docs/RELIABILITY.md")
    args = parser.parse_args(argv)
    given = argv if argv is not None else sys.argv[2:]
    command = " ".join(["python -m bench partitions", *(shlex.quote(a) for a in given)])
    names = () if args.smoke else SHORT if args.short else tuple(n.strip() for n in args.only.split(",") if n.strip())
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown partition(s): {', '.join(unknown)}")
    quiet_libraries()
    run_commit = chaos_report.commit()  # before the run: the doc it writes dirties the tree
    figures = run(names, args.seed)
    figures.update(command=command, commit=run_commit)
    if not args.no_doc and names:  # a smoke run has no partition to report
        partitions_report.write(figures)
    print(f"partitions: {'targets met' if figures['met'] else 'TARGETS MISSED'} "
          f"(setup {figures['setup_s']:g}s, total {figures['total_s']:g}s)", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    return figures
