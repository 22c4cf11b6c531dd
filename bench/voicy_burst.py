"""Voice bursts: short voices batched across jobs against one at a time, through the real fleet, in one run.

``python -m bench voicy-burst [--voices 48] [--repeats 3] [--lone 6] [--device cpu|cuda]``

Two complete fleets run side by side, identical but for one variable:
``VOICY_WORKER_CLIP_BATCH_SIZE`` (batched: 4 on a CPU, 16 on CUDA; one at a
time: 1). Each has its own Redis, dev Voicy API, fake Telegram, bridge, beat,
io worker and gpu worker (``celery -A tasks worker -Q gpu``, the Procfile's
command), production intervals (poll 1 s, progress 2.5 s, lease 30 s,
heartbeat 30 s), the same backlog limit, and the same gpu layout: on a CPU
one process per core with one thread each (the CPU-host recommendation), on
CUDA one process. Both load their model and run a warm-up burst first.

The burst is ``--voices`` voice messages of 2-20 s, spoken by the committed
speech fixtures (``devstack/fakes/synth_media.py``, seeded), so the words
said are known. The same files go through both fleets, all enqueued at once;
the bursts alternate between the fleets (A B, B A, ...) so load from other
processes on a shared host falls on both alike. Reported:

* burst time: first claim to last result, from the dev API's own timestamps
  (``claimedAt``, ``completedAt``), median and range; the speedup is one at a
  time ÷ batched per interleaved pair;
* the CPU seconds the gpu worker's processes spent on each burst (``psutil``,
  user + system): on a shared host the figure least moved by other processes,
  since wall times there swing with everyone else's load;
* WER of each fleet's transcripts against what was said (word-level edit
  distance over the whole burst), and how many voices came out word for word
  the same in both fleets;
* each voice's own wait, claim to result, averaged over the burst: a batch
  posts all its results at the end of its pass, so its first voice waits
  longer than it would alone unless the pass is faster than one at a time;
* how many voices were transcribed in batches of each size (the gpu log);
* a lone voice's time from claim to result on each fleet (``--lone`` voices
  each, alternating, the fleet otherwise idle): what batching costs a voice
  that has nobody to share a pass with.

Targets (issue 15 §1): batched burst ≥ 1.2× faster on this CPU (≥ 2× on a
GPU); WER within 0.5 points; lone voice ≤ +10 %. ``--device cuda`` runs the
same burst with ``large-v3`` in float16 (``--model`` to change it; a name is
fetched into the Hugging Face cache once, before the fleets start) and stops
with one line when CTranslate2 sees no CUDA device. The command prints its
figures as JSON and then the table docs/BENCHMARKS.md "Voice bursts" keeps.
"""

from __future__ import annotations

import os
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import ctranslate2
import psutil
from faster_whisper.utils import download_model

from bench.words import normalise, score
from devstack.fakes.synth_media import SpeechSynth
from devstack.fakes.telegram import FakeTelegram
from devstack.fakes.voicy_api import DevVoicyServer
from devstack.infra import services
from devstack.infra.procs import Proc, spawn
from devstack.infra.stack import BOT_TOKEN, TINY_MODEL_DIR, fleet_env, start_beat, start_bridge

DEFAULT_VOICES = 48
DEFAULT_REPEATS = 3
DEFAULT_LONE = 6
MIN_VOICE_S, MAX_VOICE_S = 2.0, 20.0
LONE_VOICE_S = 5.0
VOICE_SEED = 15
CPU_CLIP_BATCH = 4  # the CPU's best measured batch (batches of 8+ gained nothing over 4)
CUDA_CLIP_BATCH = 16
CUDA_MODEL = "large-v3"
NO_BATCHING = 1
JOB_TIMEOUT_S = 3600.0
POLL_S = 0.5  # only to notice the end: the figures come from the dev API's timestamps
PRODUCTION = {  # the fleet's production intervals (fleet_env's are chattier, for tests)
    "VOICY_WORKER_POLL_INTERVAL_MS": "1000", "VOICY_WORKER_PROGRESS_INTERVAL_MS": "2500",
    "VOICY_WORKER_LEASE_TTL_MS": "30000", "VOICY_WORKER_HEARTBEAT_INTERVAL_MS": "30000"}
TARGET_SPEEDUP = {"cpu": 1.2, "cuda": 2.0}
TARGET_WER_POINTS = 0.5  # the batch may be at most this many WER points worse than one at a time
TARGET_LONE_RATIO = 1.10
EXIT_NO_CUDA = 2
MAX_DIFFERING_SHOWN = 5  # voices whose words differ between the fleets, shown with both texts
TINY_MODEL_LABEL = "tiny.en (int8)"
BATCH_OF = re.compile(r"in a batch of (\d+)")
LOOK = re.compile(r"took (\d+) ready jobs beside the pass in ([\d.]+)s")  # workers/voicy/transcription.py


class NoCuda(SystemExit):
    """``--device cuda`` on a host where CTranslate2 sees no CUDA device."""


@dataclass(frozen=True)
class Voice:
    path: Path
    seconds: float
    script: str  # what was said


def make_voices(folder: Path, count: int, seed: int = VOICE_SEED) -> list[Voice]:
    folder.mkdir(parents=True, exist_ok=True)
    synth, rng = SpeechSynth(), random.Random(seed)
    voices = []
    for n in range(count):
        path = folder / f"voice-{n:03d}.ogg"
        seconds, texts = synth.write_ogg(path, rng.uniform(MIN_VOICE_S, MAX_VOICE_S), rng)
        voices.append(Voice(path, seconds, " ".join(texts)))
    return voices


class Fleet:
    """One complete fleet (its own Redis, dev API, fake Telegram and processes) with one clip batch size."""

    def __init__(self, tmp: Path, name: str, *, clip_batch: int, gpu_processes: int, backlog: int, model: str,
                 device: str) -> None:
        self.name, self.clip_batch = name, clip_batch
        tmp.mkdir(parents=True)
        self.redis = services.start_redis(tmp / "redis")
        self.server = DevVoicyServer().start()
        self.telegram = FakeTelegram(BOT_TOKEN)
        self.telegram.start()
        self.env = fleet_env(redis_url=self.redis.url, api_url=self.server.url,
                             token=self.server.create_client(f"burst-{name}"), telegram_url=self.telegram.url,
                             work_dir=tmp / "work", VOICY_WORKER_MODEL=model, VOICY_WORKER_DEVICE=device,
                             VOICY_WORKER_CLIP_BATCH_SIZE=str(clip_batch),
                             VOICY_WORKER_TRANSCRIPTION_CONCURRENCY=str(gpu_processes),
                             VOICY_WORKER_READY_QUEUE_LIMIT=str(backlog), **PRODUCTION)
        self.procs: list[Proc] = [
            spawn([sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "io", "-P", "prefork",
                   "-c", "2", "-n", f"io-{name}@bench", "-l", "WARNING", "--without-gossip", "--without-mingle"],
                  self.env, tmp / "io.log"),
            spawn([sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", "gpu", "-P", "prefork",
                   "-c", str(gpu_processes), "-n", f"gpu-{name}@bench", "-l", "INFO", "--without-gossip",
                   "--without-mingle"], self.env, tmp / "gpu.log"),
            start_beat(self.env, tmp, tmp / "beat.log"),
            start_bridge(self.env, tmp / "bridge.log"),
        ]
        self._seq = 0

    def _enqueue(self, voice: Voice) -> str:
        self._seq += 1
        file_id = f"{self.name}-{self._seq}"
        data = voice.path.read_bytes()
        self.telegram.add_file(file_id, data)
        return self.server.enqueue_job(file_id, file_size=len(data), mime_type="audio/ogg")

    def run(self, voices: list[Voice]) -> tuple[list[dict], float]:
        """Enqueue every voice at once; (their final jobs in order, seconds from first claim to last result)."""
        ids = [self._enqueue(v) for v in voices]
        deadline = time.monotonic() + JOB_TIMEOUT_S
        pending = set(ids)
        while pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {len(pending)} jobs did not finish")
            pending = {j for j in pending if self.server.get_job(j)["status"] not in ("completed", "failed")}
            if pending:
                time.sleep(POLL_S)
        jobs = [self.server.get_job(j) for j in ids]
        failed = [j.get("lastError") for j in jobs if j["status"] != "completed"]
        if failed:
            raise RuntimeError(f"{self.name}: {len(failed)} jobs failed: {failed[:3]}")
        wall = (max(j["completedAt"] for j in jobs) - min(j["claimedAt"] for j in jobs)).total_seconds()
        return jobs, wall

    def lone(self, voice: Voice) -> float:
        """One voice on the otherwise idle fleet: seconds from its claim to its result."""
        (job,), _ = self.run([voice])
        return (job["completedAt"] - job["claimedAt"]).total_seconds()

    def gpu_cpu_s(self) -> float:
        """CPU seconds used so far by the gpu worker and its pool processes."""
        parent = psutil.Process(self.procs[1].proc.pid)
        times = [p.cpu_times() for p in (parent, *parent.children(recursive=True))]
        return sum(t.user + t.system for t in times)

    def batch_sizes(self) -> dict[str, int]:
        """Voices transcribed per batch size over the whole run (``alone`` for the rest), from the gpu log."""
        counts: dict[str, int] = {}
        for line in self.procs[1].log_path.read_text(errors="replace").splitlines():
            if " transcribed in " in line:
                found = BATCH_OF.search(line)
                key = found.group(1) if found else "alone"
                counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))

    def looks(self) -> dict[str, float]:
        """Jobs taken beside a pass and the seconds those looks took (their claim, ``/transcribe`` and
        media fetch), from the gpu log: the work a rolling batch keeps off the decoding thread."""
        jobs, seconds = 0, 0.0
        for found in LOOK.finditer(self.procs[1].log_path.read_text(errors="replace")):
            jobs, seconds = jobs + int(found.group(1)), seconds + float(found.group(2))
        return {"jobs": jobs, "seconds": round(seconds, 3), "ms_per_job": round(1000 * seconds / max(1, jobs), 1)}

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.telegram.stop()
        self.server.stop()
        self.redis.stop()


def _texts_of(jobs: list[dict]) -> list[str]:
    return [str(j.get("resultText") or "") for j in jobs]


def _wer(voices: list[Voice], texts: list[str]) -> float:
    """Word errors over the whole burst ÷ words said (each voice aligned with its own script, bench.words)."""
    scores = [score(v.script, t) for v, t in zip(voices, texts)]
    return sum(s.wer * s.words_said for s in scores) / max(1, sum(s.words_said for s in scores))


def _spread(values: list[float], digits: int = 2) -> dict[str, float]:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


def check_device(device: str) -> None:
    if device == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        raise NoCuda("voicy-burst --device cuda: no CUDA device visible to CTranslate2 on this host")


def resolve_model(device: str, model: str | None) -> str:
    """The model the fleets load: tiny.en from the offline package on a CPU, large-v3 on CUDA.

    A model *name* is resolved to its local directory here (faster-whisper fetches it into the
    Hugging Face cache once, if it is not there), so the fleets' workers load it offline.
    """
    name = model or (CUDA_MODEL if device == "cuda" else TINY_MODEL_DIR)
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser())
    return str(download_model(name))


def run(voices: int = DEFAULT_VOICES, repeats: int = DEFAULT_REPEATS, lone: int = DEFAULT_LONE,
        device: str = "cpu", model: str | None = None) -> dict[str, object]:
    check_device(device)
    model_path = resolve_model(device, model)
    gpu_processes = len(os.sched_getaffinity(0)) if device == "cpu" else 1
    clip_batch = CPU_CLIP_BATCH if device == "cpu" else CUDA_CLIP_BATCH
    with tempfile.TemporaryDirectory(prefix="sy-burst-") as tmp_name:
        tmp = Path(tmp_name)
        burst = make_voices(tmp / "voices", voices)
        (lone_voice,) = make_voices(tmp / "lone", 1, seed=VOICE_SEED + 1) if lone else (None,)
        backlog = gpu_processes * (clip_batch + 1)  # the batched fleet's default, the same for both fleets
        fleets = {label: Fleet(tmp / label, label, clip_batch=size, gpu_processes=gpu_processes, backlog=backlog,
                               model=model_path, device=device)
                  for label, size in (("batched", clip_batch), ("one_at_a_time", NO_BATCHING))}
        walls: dict[str, list[float]] = {label: [] for label in fleets}
        cpus: dict[str, list[float]] = {label: [] for label in fleets}
        waits: dict[str, list[float]] = {label: [] for label in fleets}
        texts: dict[str, list[str]] = {}
        lones: dict[str, list[float]] = {label: [] for label in fleets}
        loads: list[float] = []
        try:
            for fleet in fleets.values():  # every gpu process loads its model; a burst warms the rest
                fleet.run(burst[:2 * gpu_processes * max(2, clip_batch // 2)])
            order = list(fleets)
            for i in range(repeats):
                for label in order if i % 2 == 0 else order[::-1]:
                    loads.append(os.getloadavg()[0])
                    cpu_before = fleets[label].gpu_cpu_s()
                    jobs, wall = fleets[label].run(burst)
                    cpus[label].append(fleets[label].gpu_cpu_s() - cpu_before)
                    waits[label].append(statistics.fmean((j["completedAt"] - j["claimedAt"]).total_seconds()
                                                         for j in jobs))
                    walls[label].append(wall)
                    texts[label] = _texts_of(jobs)
            if lone_voice is not None:
                for i in range(lone):
                    for label in order if i % 2 == 0 else order[::-1]:
                        lones[label].append(fleets[label].lone(lone_voice))
            batches, looks = fleets["batched"].batch_sizes(), fleets["batched"].looks()
        finally:
            for fleet in fleets.values():
                fleet.close()
    pairs = [one / batched for one, batched in zip(walls["one_at_a_time"], walls["batched"])]
    cpu_pairs = [one / batched for one, batched in zip(cpus["one_at_a_time"], cpus["batched"])]
    wer = {label: _wer(burst, texts[label]) for label in fleets}
    differing = [i for i, (a, b) in enumerate(zip(texts["batched"], texts["one_at_a_time"]))
                 if normalise(a) != normalise(b)]
    figures: dict[str, object] = {
        "device": device, "model": TINY_MODEL_LABEL if model_path == TINY_MODEL_DIR else Path(model_path).name,
        "gpu_processes": gpu_processes,
        "clip_batch_size": clip_batch, "voices": voices, "audio_s": round(sum(v.seconds for v in burst), 1),
        "repeats": repeats, "load_avg_1m_before_bursts": _spread(loads),
        "burst_s": {label: {"per_run": [round(w, 2) for w in walls[label]], **_spread(walls[label])}
                    for label in fleets},
        "speedup": {"per_pair": [round(p, 2) for p in pairs], **_spread(pairs)},
        "gpu_cpu_s": {label: {"per_run": [round(c, 1) for c in cpus[label]], **_spread(cpus[label], 1)}
                      for label in fleets},
        "cpu_speedup": {"per_pair": [round(p, 2) for p in cpu_pairs], **_spread(cpu_pairs)},
        "wer_pct": {label: round(100 * w, 2) for label, w in wer.items()},
        "wer_points_worse": round(100 * (wer["batched"] - wer["one_at_a_time"]), 2),  # below 0: batched is better
        "voices_word_for_word_same": f"{voices - len(differing)}/{voices}",
        "differing_voices": [{"voice": i, "seconds": burst[i].seconds, "said": burst[i].script,
                              **{label: texts[label][i] for label in fleets}}
                             for i in differing[:MAX_DIFFERING_SHOWN]],
        "voice_claim_to_result_mean_s": {label: _spread(waits[label]) for label in fleets},
        "voices_by_batch_size": batches,
        "taken_beside_a_pass": looks,
    }
    if lone_voice is not None:
        figures["lone_voice"] = {"seconds": round(lone_voice.seconds, 1),
                                 **{f"{label}_claim_to_result_s": _spread(lones[label], 3) for label in fleets},
                                 "ratio": round(statistics.median(lones["batched"])
                                                / statistics.median(lones["one_at_a_time"]), 3)}
    return figures


def table(figures: dict[str, object]) -> str:
    """The docs/BENCHMARKS.md table for one run's figures, each row with its target and verdict."""
    burst, speed, wer = figures["burst_s"], figures["speedup"], figures["wer_pct"]
    cpu, cpu_speed = figures["gpu_cpu_s"], figures["cpu_speedup"]
    waits = figures["voice_claim_to_result_mean_s"]
    target = TARGET_SPEEDUP[str(figures["device"])]
    rows = [
        "| figure | batched | one at a time | target | met |",
        "|---|---|---|---|---|",
        f"| burst of {figures['voices']} voices ({figures['audio_s']} s of audio), s, median (range) | "
        f"{burst['batched']['median']} ({burst['batched']['min']}–{burst['batched']['max']}) | "  # type: ignore[index]
        f"{burst['one_at_a_time']['median']} ({burst['one_at_a_time']['min']}–"  # type: ignore[index]
        f"{burst['one_at_a_time']['max']}) | | |",  # type: ignore[index]
        f"| speedup, per interleaved pair | {speed['median']}× ({speed['min']}–{speed['max']}) | 1× | "  # type: ignore[index]
        f"≥ {target}× | {'yes' if speed['median'] >= target else 'no'} |",  # type: ignore[index]
        f"| gpu worker CPU s per burst, median | {cpu['batched']['median']} | {cpu['one_at_a_time']['median']} | | "  # type: ignore[index]
        f"{cpu_speed['median']}× less ({cpu_speed['min']}–{cpu_speed['max']}) |",  # type: ignore[index]
        f"| WER against the scripts | {wer['batched']} % | {wer['one_at_a_time']} % | "  # type: ignore[index]
        f"at most {TARGET_WER_POINTS} points worse | "
        f"{'yes' if figures['wer_points_worse'] <= TARGET_WER_POINTS else 'no'} |",  # type: ignore[operator]
        f"| voices word for word the same | {figures['voices_word_for_word_same']} | | | |",
        f"| a voice's claim → result in the burst, mean, s, median | {waits['batched']['median']} | "  # type: ignore[index]
        f"{waits['one_at_a_time']['median']} | | |",  # type: ignore[index]
    ]
    looks = figures.get("taken_beside_a_pass")
    if isinstance(looks, dict) and looks["jobs"]:
        rows.append(f"| jobs taken beside a pass (claim, `/transcribe`, media), ms per job | "
                    f"{looks['ms_per_job']} ({looks['jobs']} jobs) | | | |")
    lone = figures.get("lone_voice")
    if isinstance(lone, dict):
        bound_pct = round(100 * (TARGET_LONE_RATIO - 1))
        rows.append(f"| lone {lone['seconds']} s voice, claim → result, s, median | "
                    f"{lone['batched_claim_to_result_s']['median']} | "
                    f"{lone['one_at_a_time_claim_to_result_s']['median']} | ≤ +{bound_pct} % | "
                    f"{'yes' if lone['ratio'] <= TARGET_LONE_RATIO else 'no'} ({lone['ratio']}×) |")
    load = figures["load_avg_1m_before_bursts"]
    head = (f"{figures['device']}, {figures['model']}, {figures['gpu_processes']} gpu process(es), clip batches "
            f"of {figures['clip_batch_size']}, {figures['repeats']} interleaved repeat(s), load average "
            f"{load['min']}–{load['max']}")  # type: ignore[index]
    return head + "\n\n" + "\n".join(rows)
