"""Words against the known scripts: ``python -m bench words`` (every recording × every engine).

The scoring (WER, lost runs, normalised words) lives in ``bench.wer`` and is
re-exported here. The target is no lost run, for every engine, on every
recording. Not load-sensitive (the words do not depend on timing), so any box
gives the lead's figures; the table in docs/BENCHMARKS.md "Words" is this
suite's output.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.recordings import PERTURBATIONS, Recording, clips, demo_long_message, long_recording, perturbed
from bench.wer import LOST_RUN_WORDS, WordScore, normalise, score
from workers.transcribe.engine import create_engine
from workers.transcribe.protocol import TranscriptionEngine
from workers.transcribe.registry import BATCHED_ENGINE, SEQUENTIAL_ENGINE
from workers.transcribe.settings import EngineSettings

__all__ = ["LOST_RUN_WORDS", "WordScore", "engines", "normalise", "run", "score"]

BENCH_BATCH_SIZE = 8  # the batched engine's batch in every word run
RECORDING_MINUTES = 5.0  # the engine bench's recording


def engines(cpu_threads: int = 0, batch_size: int = BENCH_BATCH_SIZE) -> dict[str, TranscriptionEngine]:
    """Both engines on the offline tiny.en model, the fleet's options (``VOICY_WORKER_*`` defaults)."""
    from devstack.infra.stack import TINY_MODEL_DIR

    base = {"model": TINY_MODEL_DIR, "device": "cpu", "cpu_threads": cpu_threads}
    return {SEQUENTIAL_ENGINE: create_engine(EngineSettings(**base, batch_size=0)),  # type: ignore[arg-type]
            BATCHED_ENGINE: create_engine(EngineSettings(**base, batch_size=batch_size))}  # type: ignore[arg-type]



def _transcripts(loaded: dict[str, TranscriptionEngine], rec: Recording) -> dict[str, str]:
    return {name: engine.transcribe(rec.path).text for name, engine in loaded.items()}


def _row(rec: Recording, texts: dict[str, str]) -> dict[str, object]:
    row: dict[str, object] = {"duration_s": round(rec.duration_s, 1)}
    row.update({name: score(rec.script, text).as_dict() for name, text in texts.items()})
    if {SEQUENTIAL_ENGINE, BATCHED_ENGINE} <= texts.keys():
        row["batched_vs_sequential_wer_pct"] = round(100 * score(texts[SEQUENTIAL_ENGINE],
                                                                 texts[BATCHED_ENGINE]).wer, 1)
    return row


def _perturbed_summary(scores: dict[str, list[WordScore]]) -> dict[str, object]:
    """Per engine over the perturbed copies: mean WER, copies with a lost run, words lost in runs."""
    return {name: {"wer_pct_mean": round(100 * sum(s.wer for s in found) / len(found), 1),
                   "wer_pct_max": round(100 * max(s.wer for s in found), 1),
                   "copies_with_lost_runs": sum(1 for s in found if s.lost_runs),
                   "words_lost_in_runs": sum(len(r.split()) for s in found for r in s.lost_runs)}
            for name, found in scores.items()}


def run(perturbations: int = len(PERTURBATIONS), cpu_threads: int = 0) -> dict[str, object]:
    """Per recording: each engine's score against the script, and the engines' words against each other;
    then the demo message's perturbed copies, summarised."""
    loaded = engines(cpu_threads)
    table: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="sy-words-") as tmp:
        directory = Path(tmp)
        demo = demo_long_message(directory)
        for rec in [*clips(), demo, long_recording(directory, RECORDING_MINUTES)]:
            table[rec.name] = _row(rec, _transcripts(loaded, rec))
        scores: dict[str, list[WordScore]] = {name: [] for name in loaded}
        for p in PERTURBATIONS[:perturbations]:
            rec = perturbed(demo, directory, *p)
            for name, text in _transcripts(loaded, rec).items():
                scores[name].append(score(rec.script, text))
            rec.path.unlink()
        if perturbations:
            table[f"{demo.name}, {perturbations} perturbed copies"] = _perturbed_summary(scores)
    return table
