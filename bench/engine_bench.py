"""Engine benchmark: the batched engine against the sequential one on one long recording.

``python -m bench engine [--minutes M] [--repeats N] [--batch-sizes 8,16]``.
The recording is the audio fixtures joined end to end (0.6 s of silence
between them) until it lasts ``M`` minutes, written as 16 kHz WAV. Each engine
loads the offline tiny.en model once with the same options (CPU, int8, beam 5,
VAD, ``VOICY_WORKER_CPU_THREADS`` auto for one process), transcribes a short
fixture to warm up, then the recording ``N`` times. Runs are interleaved
(sequential, batched, …, the first engine alternating) so that load from
other processes on a shared host falls on both sides alike.

Reported per engine: wall seconds of each run, their median and spread, the
CPU seconds of each run (``time.process_time``: every thread of this process,
so CTranslate2's too, and mostly insensitive to other processes), and the
real-time factor, its words against what was said (``bench.words``: WER and
runs of lost words) and against the sequential engine, and for a batched
engine how many batched passes it ran and how many windows it resumed
(``workers.transcribe.seek``). ``speed_vs_sequential`` is sequential wall ÷
batched wall per interleaved pair (above 1: batched is faster). The host's
load average before each run is recorded, since the figures mean little
without it.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.recordings import long_recording
from bench.words import score
from devstack.infra.stack import AUDIO_DIR, TINY_MODEL_DIR
from workers.transcribe.engine import create_engine
from workers.transcribe.protocol import TranscriptionEngine
from workers.transcribe.registry import SEQUENTIAL_ENGINE
from workers.transcribe.settings import AUTO_CPU_THREADS, EngineSettings

DEFAULT_MINUTES = 5.0
DEFAULT_REPEATS = 5
DEFAULT_BATCH_SIZES = (8,)
WARM_UP_FIXTURE = "weather.ogg"


def _timed(engine: TranscriptionEngine, path: Path) -> tuple[float, float, str]:
    """(wall s, CPU s of this process, text) of one transcription."""
    wall, cpu = time.perf_counter(), time.process_time()
    text = engine.transcribe(path).text
    return time.perf_counter() - wall, time.process_time() - cpu, text


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2)}


def run(minutes: float = DEFAULT_MINUTES, repeats: int = DEFAULT_REPEATS,
        batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES, cpu_threads: int = AUTO_CPU_THREADS) -> dict[str, object]:
    """``cpu_threads`` as ``VOICY_WORKER_CPU_THREADS`` (0: auto, all usable cores for one process)."""
    base: dict[str, Any] = {"model": TINY_MODEL_DIR, "device": "cpu", "cpu_threads": cpu_threads}
    engines: dict[str, TranscriptionEngine] = {SEQUENTIAL_ENGINE: create_engine(EngineSettings(**base, batch_size=0))}
    for size in batch_sizes:
        engines[f"batched-{size}"] = create_engine(EngineSettings(**base, batch_size=size))
    names = list(engines)
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    texts: dict[str, str] = {}
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as tmp:
        recording = long_recording(Path(tmp), minutes)
        for engine in engines.values():
            engine.transcribe(AUDIO_DIR / WARM_UP_FIXTURE)
        decoders = {n: getattr(e, "decoder", None) for n, e in engines.items()}
        passes_before = {n: (d.passes, d.resumed) for n, d in decoders.items() if d is not None}
        for i in range(repeats):
            order = names if i % 2 == 0 else names[::-1]
            for name in order:
                loads.append(os.getloadavg()[0])
                wall, cpu, texts[name] = _timed(engines[name], recording.path)
                walls[name].append(wall)
                cpus[name].append(cpu)
    figures: dict[str, object] = {
        "audio_s": round(recording.duration_s, 1), "repeats": repeats, "cores": len(os.sched_getaffinity(0)),
        "cpu_threads": getattr(engines[SEQUENTIAL_ENGINE], "cpu_threads", None),
        "load_avg_1m_before_runs": _spread(loads)}
    for name in names:
        entry: dict[str, object] = {"wall_s": [round(w, 2) for w in walls[name]], "wall": _spread(walls[name]),
                                    "cpu_s": [round(c, 2) for c in cpus[name]], "cpu": _spread(cpus[name]),
                                    "realtime_x": round(recording.duration_s / statistics.median(walls[name]), 1),
                                    "words": score(recording.script, texts[name]).as_dict()}
        decoder = decoders[name]
        if decoder is not None:
            passes, resumed = passes_before[name]
            entry["passes_per_run"] = (decoder.passes - passes) / repeats
            entry["windows_resumed_per_run"] = (decoder.resumed - resumed) / repeats
        if name != SEQUENTIAL_ENGINE:
            pairs = [s / b for s, b in zip(walls[SEQUENTIAL_ENGINE], walls[name])]
            entry["speed_vs_sequential"] = {"per_pair": [round(p, 2) for p in pairs], **_spread(pairs)}
            entry["cpu_vs_sequential"] = round(statistics.median(cpus[SEQUENTIAL_ENGINE])
                                               / statistics.median(cpus[name]), 2)
            entry["wer_vs_sequential_pct"] = round(100 * score(texts[SEQUENTIAL_ENGINE], texts[name]).wer, 1)
        figures[name] = entry
    return figures
