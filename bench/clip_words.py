"""Clip batches against one at a time, engine only: words against the scripts, and cost per clip by batch size.

``python -m bench.clip_words [--voices 48] [--sizes 4,16,48] [--device cpu|cuda] [--model DIR]``

The voices are ``bench voicy-burst``'s seed (2-20 s, spoken by the committed
fixtures, so the script is known). One engine transcribes each voice alone
(``transcribe``, the sequential engine); engines with clip batches of each
size transcribe them all through ``transcribe_clips``, a clip it leaves to the
caller transcribed alone, as the gpu worker does. Reported: WER of each
against the scripts (bench.words), how many voices have the same normalised
words as alone, each voice whose words differ, and per clip the wall and
process CPU seconds of each way. The voices transcribed alone a second time
give the noise floor: the sequential engine's temperature fallback samples, so
a voice that falls back (a sentence said over and over reads as a repetition
loop) gets other words on each call. No Redis, no Celery: ``workers.transcribe``
and a model directory only, so a GPU host can run it (``--device cuda``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.gpu import prepare_seeded
from bench.voicy_burst import DEFAULT_VOICES, Voice, make_voices
from bench.words import normalise, score
from workers.transcribe.engine import create_engine
from workers.transcribe.protocol import Clip, ClipBatchingEngine
from workers.transcribe.results import Transcript
from workers.transcribe.settings import EngineSettings

DEFAULT_SIZES = (4, 16, 48)
WER_DIGITS = 2
COST_DIGITS = 3


@dataclass(frozen=True)
class Run:
    """One way of transcribing the voices: each voice's text, and what it cost."""

    texts: list[str]
    wall_s: float
    cpu_s: float
    left_to_caller: int = 0  # clips the batch did not answer (transcribed alone afterwards)


def load(model: str, device: str, clip_batch: int, cpu_threads: int = 0) -> ClipBatchingEngine:
    """The sequential engine with clip batches of ``clip_batch`` (1: none) on ``device``."""
    engine = create_engine(EngineSettings(model=model, device=device, cpu_threads=cpu_threads, batch_size=0,
                                          clip_batch_size=clip_batch))
    assert isinstance(engine, ClipBatchingEngine)
    return engine


def alone(engine: ClipBatchingEngine, voices: list[Voice]) -> Run:
    """Each voice transcribed on its own."""
    wall, cpu = time.perf_counter(), time.process_time()
    texts = [engine.transcribe(v.path).text for v in voices]
    return Run(texts, time.perf_counter() - wall, time.process_time() - cpu)


def batched(engine: ClipBatchingEngine, voices: list[Voice]) -> Run:
    """All voices through ``transcribe_clips``; a clip left to the caller is transcribed alone."""
    wall, cpu = time.perf_counter(), time.process_time()
    outcomes = engine.transcribe_clips([Clip(v.path) for v in voices])
    texts, left = [], 0
    for voice, outcome in zip(voices, outcomes):
        if outcome is None:
            left += 1
            outcome = engine.transcribe(voice.path)
        if not isinstance(outcome, Transcript):
            raise RuntimeError(f"{voice.path.name}: {outcome!r}")
        texts.append(outcome.text)
    return Run(texts, time.perf_counter() - wall, time.process_time() - cpu, left)


def burst_wer(voices: list[Voice], texts: list[str]) -> float:
    """Word errors over all voices ÷ words said, in percent."""
    scores = [score(v.script, t) for v, t in zip(voices, texts)]
    errors = sum(s.substitutions + s.deletions + s.insertions for s in scores)
    return round(100 * errors / sum(s.words_said for s in scores), WER_DIGITS)


def compare(voices: list[Voice], one: Run, other: Run, label: str = "batched") -> dict[str, object]:
    """``other``'s words against the scripts and against ``one``'s, with every voice that differs."""
    differing = [{"voice": v.path.name, "said": v.script, "alone": a, label: b}
                 for v, a, b in zip(voices, one.texts, other.texts) if normalise(a) != normalise(b)]
    return {"wer_pct": burst_wer(voices, other.texts), "same_words": len(voices) - len(differing),
            "left_to_caller": other.left_to_caller, "differing": differing}


def per_clip(run: Run, count: int) -> dict[str, float]:
    return {"wall_s": round(run.wall_s / count, COST_DIGITS), "cpu_s": round(run.cpu_s / count, COST_DIGITS)}


def measure(model: str, voices: list[Voice], sizes: tuple[int, ...] = DEFAULT_SIZES, device: str = "cpu",
            cpu_threads: int = 0) -> dict[str, object]:
    """The figures for ``voices``: one at a time twice (the second, its noise floor), then clip batches
    of each size (after a warm-up)."""
    prepare_seeded(device)
    single = load(model, device, 1, cpu_threads)
    single.transcribe(voices[0].path)  # warm-up
    reference = alone(single, voices)
    again = compare(voices, reference, alone(single, voices), "alone_again")
    figures: dict[str, object] = {"voices": len(voices), "device": device,
                                  "one_at_a_time": {"wer_pct": burst_wer(voices, reference.texts),
                                                    **per_clip(reference, len(voices))},
                                  "one_at_a_time_again": {k: again[k] for k in ("wer_pct", "same_words", "differing")}}
    for size in sizes:
        engine = load(model, device, size, cpu_threads)
        engine.transcribe_clips([Clip(v.path) for v in voices[:size]])  # warm-up at this size
        run = batched(engine, voices)
        figures[f"clip_batch_{size}"] = {**compare(voices, reference, run), **per_clip(run, len(voices))}
    return figures


def main(argv: list[str] | None = None) -> None:
    from devstack.infra.stack import TINY_MODEL_DIR

    parser = argparse.ArgumentParser(prog="python -m bench.clip_words", description=__doc__.splitlines()[0])
    parser.add_argument("--voices", type=int, default=DEFAULT_VOICES)
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--model", default=TINY_MODEL_DIR)
    parser.add_argument("--cpu-threads", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sy-clip-words-") as tmp:
        voices = make_voices(Path(tmp), args.voices)
        sizes = tuple(int(s) for s in args.sizes.split(","))
        print(json.dumps(measure(args.model, voices, sizes, args.device, args.cpu_threads), indent=1))


if __name__ == "__main__":
    main()
