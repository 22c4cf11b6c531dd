"""Words against the known scripts: ``python -m bench words`` (every recording × every engine).

Word error rate is jiwer's (word-level edit distance: substitutions,
deletions, insertions ÷ words said) on normalised words: lower case,
punctuation dropped, small numbers spelled out (Whisper writes "10" where the
script says "ten"). Punctuation and case are never compared: they differ
between CPU kernels (AVX2 against AVX-512) for the same model.

Besides WER, a *lost run* is a stretch of at least ``LOST_RUN_WORDS``
consecutive words of the script that the transcript skips: a decoding failure
(a window skipped, a chunk's last sentence dropped), not a mishearing. The
target is none, for every engine, on every recording.

Not load-sensitive (the words do not depend on timing), so any box gives the
lead's figures; the table in docs/BENCHMARKS.md "Words" is this suite's output.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jiwer

from bench.recordings import PERTURBATIONS, Recording, clips, demo_long_message, long_recording, perturbed
from workers.transcribe.engine import create_engine
from workers.transcribe.protocol import TranscriptionEngine
from workers.transcribe.registry import BATCHED_ENGINE, SEQUENTIAL_ENGINE
from workers.transcribe.settings import EngineSettings

WORD_RE = re.compile(r"[a-z0-9']+")
LOST_RUN_WORDS = 5  # this many script words in a row missing: a skipped stretch, not a mishearing
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
                "nineteen", "twenty")
BENCH_BATCH_SIZE = 8  # the batched engine's batch in every word run
RECORDING_MINUTES = 5.0  # the engine bench's recording


def normalise(text: str) -> list[str]:
    """Lower-case words without punctuation; numbers up to twenty as words."""
    words = WORD_RE.findall(text.lower())
    return [NUMBER_WORDS[int(w)] if w.isdigit() and int(w) < len(NUMBER_WORDS) else w for w in words]


@dataclass(frozen=True)
class WordScore:
    """One transcript against its script."""

    wer: float
    words_said: int
    words_heard: int
    substitutions: int
    deletions: int
    insertions: int
    lost_runs: tuple[str, ...]  # each skipped stretch of at least LOST_RUN_WORDS script words

    def as_dict(self) -> dict[str, object]:
        return {"wer_pct": round(100 * self.wer, 1), "words": f"{self.words_heard}/{self.words_said}",
                "sub": self.substitutions, "del": self.deletions, "ins": self.insertions,
                "lost_runs": [f"{len(r.split())} words: {r}" for r in self.lost_runs]}


def score(script: str, transcript: str) -> WordScore:
    """``transcript`` against ``script``, both normalised."""
    said, heard = normalise(script), normalise(transcript)
    out = jiwer.process_words(" ".join(said), " ".join(heard) or "<nothing>")
    runs = tuple(" ".join(said[c.ref_start_idx:c.ref_end_idx]) for c in out.alignments[0]
                 if c.type == "delete" and c.ref_end_idx - c.ref_start_idx >= LOST_RUN_WORDS)
    return WordScore(out.wer, len(said), len(heard), out.substitutions, out.deletions, out.insertions, runs)


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
