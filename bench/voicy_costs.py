"""The per-job cost table: every fixed cost of a Voicy job from claim to result, in ms, from the real fleet.

``python -m bench voicy-costs [--repeats N]``. The fleet (``bench.voicy_rig``:
the Procfile's lines at production settings, beat included) takes one job at
a time, so no two jobs' steps overlap: each speech fixture and a synthesised
5 s voice, ``N`` rounds. Every step is measured, none estimated: the request
spans at the dev Voicy API and the fake Telegram and the workers' own Celery
task events (``bench.voicy_trace``), laid end to end per job. A step between
two of them is the fleet's own work there (Redis, the media store, Python).

The engine's share is split off too: the transcription step against the same
file transcribed by faster-whisper directly (``bench.direct``, the same model,
threads and options) in the same round.

The threshold: 5 % of a 5 s voice's direct transcription time on this box
(issue 15: cut every fixed cost above it). Only steps on the gpu slot's path
add to a burst's time one for one (the io side overlaps the previous job's
transcription), so the table marks which side each step is on.

The burst view (:func:`gpu_slot_gaps`, used by ``python -m bench voicy``):
for consecutive transcriptions on the one gpu slot, the slot's idle time
between a task's end and the next one's start, and each task's time beyond
its engine call.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.recordings import clips
from bench.voicy_rig import Burst, Direct, FleetRig, fleet_threads
from bench.voicy_trace import Span, TaskEvent, timeline
from devstack.fakes.synth_media import write_speech_ogg

REFERENCE_VOICE_S = 5.0  # issue 15: a cost above THRESHOLD_PCT of this voice's transcription is cut
THRESHOLD_PCT = 5.0
DEFAULT_REPEATS = 5
WARM_UP_JOBS = 2

Marks = dict[str, Span]
Step = tuple[str, str, Callable[[Marks], float]]  # (what, which side, ms from a job's marks)


def _ms(seconds: float) -> float:
    return 1000.0 * seconds


def _gap(a: str, a_end: bool, b: str) -> Callable[[Marks], float]:
    """From the end (or start) of mark ``a`` to the start of mark ``b``."""
    return lambda m: _ms(m[b].start - (m[a].end if a_end else m[a].start))


def _span(a: str) -> Callable[[Marks], float]:
    return lambda m: _ms(m[a].end - m[a].start)


# Celery's task-sent event is stamped after the message is published, sometimes after the worker
# took it: a hop is measured from the sender's previous step to the task's start instead.
DL_STARTED = "voicy.download:task-started"
TR_STARTED, TR_DONE = "voicy.transcribe:task-started", "voicy.transcribe:task-succeeded"
# Which side a step is on: only the gpu slot's own steps (task start → task end) hold the slot; in a
# burst, the bridge's and the io side's overlap the previous job's transcription.
IO, GPU, BRIDGE = "io", "gpu slot", "bridge"
STEPS: tuple[Step, ...] = (
    ("POST /jobs/claim-download", BRIDGE, _span("claim-download")),
    ("bridge: record the claim (Redis), send the download task; Celery hop to an io process", BRIDGE,
     _gap("claim-download", True, DL_STARTED)),
    ("io: take the lease → GET source", IO, _gap(DL_STARTED, False, "source")),
    ("GET /jobs/:id/source", IO, _span("source")),
    ("io: → getFile", IO, _gap("source", True, "getFile")),
    ("Telegram getFile", IO, _span("getFile")),
    ("io: → download", IO, _gap("getFile", True, "download")),
    ("Telegram download", IO, _span("download")),
    ("io: store the media, update the job record", IO, _gap("download", True, "downloaded")),
    ("POST /jobs/:id/downloaded", IO, _span("downloaded")),
    ("io: hand the lease over, send the transcription task; Celery hop to the gpu process", IO,
     _gap("downloaded", True, TR_STARTED)),
    ("gpu: take the lease, check the media → POST transcribe", GPU, _gap(TR_STARTED, False, "transcribe")),
    ("POST /jobs/:id/transcribe", GPU, _span("transcribe")),
    ("POST /jobs/:id/result", GPU, _span("result")),
    ("gpu: delete the media, forget the job, release the lease", GPU, _gap("result", True, TR_DONE)),
)
TRANSCRIPTION = "transcription step (POST transcribe → POST result, progress posts excluded)"
ENGINE_EXTRA = "of which beyond direct faster-whisper on the same file"
PROGRESS = "progress posts (all of one job)"


@dataclass
class JobCosts:
    """One job's steps in ms, its transcription step and its direct time."""

    file: str
    steps: dict[str, float]
    transcription_ms: float
    progress_ms: float
    progress_posts: int
    direct_ms: float
    direct_cpu_ms: float
    claim_to_result_ms: float


def job_costs(spans: list[Span], direct: dict, file: str) -> JobCosts:
    """The steps of one job's timeline (its marks: first occurrence of each name; progress summed)."""
    marks: Marks = {}
    for s in spans:
        marks.setdefault(s.name, s)
    progress = [s for s in spans if s.name == "progress"]
    progress_ms = sum(_ms(s.end - s.start) for s in progress)
    steps = {what: fn(marks) for what, _, fn in STEPS}
    transcription = _ms(marks["result"].start - marks["transcribe"].end) - progress_ms
    return JobCosts(file, steps, transcription, progress_ms, len(progress), _ms(direct["per_file_s"][0]),
                    _ms(direct["cpu_s"]), _ms(marks[TR_DONE].start - marks["claim-download"].start))


def _one_by_one(rig: FleetRig, direct: Direct, files: list[Path]) -> list[JobCosts]:
    """Each file alone through the fleet, then alone through direct faster-whisper."""
    costs = []
    for path in files:
        burst: Burst = rig.run([path])
        alone = direct.run([path])
        spans = timeline(burst.job_ids[0], burst.file_ids[0], rig.server.clock.take(), rig.telegram.clock.take(),
                         rig.events.take())
        costs.append(job_costs(spans, alone, path.name))
    return costs


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


def table(costs: list[JobCosts], threshold_ms: float) -> list[dict[str, object]]:
    """Median and range per step over every job; ``over_threshold`` marks what issue 15 says to cut."""
    sides = {what: side for what, side, _ in STEPS}
    rows: list[dict[str, object]] = []

    def row(what: str, side: str, values: list[float]) -> None:
        rows.append({"step": what, "side": side, "median_ms": _median(values), "min_ms": round(min(values), 1),
                     "max_ms": round(max(values), 1), "over_threshold": statistics.median(values) > threshold_ms})

    for what in sides:
        row(what, sides[what], [c.steps[what] for c in costs])
    row(PROGRESS, GPU, [c.progress_ms for c in costs])
    row(TRANSCRIPTION, GPU, [c.transcription_ms for c in costs])
    row(ENGINE_EXTRA, GPU, [c.transcription_ms - c.direct_ms for c in costs])
    return rows


def run(repeats: int = DEFAULT_REPEATS) -> dict[str, object]:
    files = [c.path for c in clips()]
    with tempfile.TemporaryDirectory(prefix="sy-bench-costs-") as tmp:
        voice = Path(tmp) / "voice-5s.ogg"
        write_speech_ogg(voice, REFERENCE_VOICE_S)
        files.append(voice)
        rig = FleetRig(Path(tmp))
        direct = Direct(fleet_threads(), files[:WARM_UP_JOBS])
        try:
            rig.run(files[:WARM_UP_JOBS])  # every fleet process loads what it needs, as on a long-running host
            idle = rig.idle_cpu_ms_per_s()
            costs: list[JobCosts] = []
            before, started = rig.cpu_seconds(), time.time()
            for _ in range(repeats):
                costs += _one_by_one(rig, direct, files)
            cpu = _cpu_per_job(before, rig.cpu_seconds(), idle, time.time() - started, len(costs))
        finally:
            direct.close()
            rig.close()
    voice_direct = [c.direct_ms for c in costs if c.file == voice.name]
    threshold = THRESHOLD_PCT / 100 * statistics.median(voice_direct)
    gpu_fixed = [sum(c.steps[w] for w, side, _ in STEPS if side == GPU) + c.progress_ms
                 + (c.transcription_ms - c.direct_ms) for c in costs]
    return {
        "jobs": len(costs), "cpu_threads": fleet_threads(),
        "reference_voice_direct_ms": _median(voice_direct), "threshold_ms": round(threshold, 1),
        "gpu_path_fixed_ms_median": _median(gpu_fixed),
        "claim_to_result_ms_median": _median([c.claim_to_result_ms for c in costs]),
        "progress_posts": sum(c.progress_posts for c in costs),
        "steps": table(costs, threshold),
        "idle_cpu_ms_per_s": idle,
        "cpu_ms_per_job": cpu,
        "direct_cpu_ms_per_job": round(statistics.fmean(c.direct_cpu_ms for c in costs), 1),
    }


def _cpu_per_job(before: dict[str, float], after: dict[str, float], idle: dict[str, float], seconds: float,
                 jobs: int) -> dict[str, dict[str, float]]:
    """CPU ms per job by process: in all, and beyond what the process burns idle over the same time
    (the fleet idles between these one-at-a-time jobs, so its polls are in the total)."""
    found = {}
    for name, total_s in after.items():
        spent = 1000 * (total_s - before.get(name, 0.0))
        found[name] = {"total": round(spent / jobs, 1),
                       "beyond_idle": round((spent - idle.get(name, 0.0) * seconds) / jobs, 1)}
    return found


def gpu_slot_gaps(events: list[TaskEvent], job_ids: set[str]) -> dict[str, float]:
    """In a burst: the gpu slot's idle ms between one transcription's end and the next one's start."""
    mine = [e for e in events if e.job_id in job_ids and e.task == "voicy.transcribe"]
    starts = sorted(e.at for e in mine if e.kind == "task-started")
    ends = sorted(e.at for e in mine if e.kind == "task-succeeded")
    gaps = [_ms(s - e) for e, s in zip(ends, starts[1:]) if s >= e]
    if not gaps:
        return {"idle_gaps": 0}
    return {"idle_gaps": len(gaps), "idle_ms_median": _median(gaps), "idle_ms_total": round(sum(gaps), 1)}
