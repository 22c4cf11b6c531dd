"""Words against a script: WER and lost runs on normalised words (jiwer), importing nothing else of ours.

Word error rate is jiwer's (word-level edit distance: substitutions,
deletions, insertions ÷ words said) on normalised words: lower case,
punctuation dropped, small numbers spelled out (Whisper writes "10" where the
script says "ten"). Punctuation and case are never compared: they differ
between CPU kernels (AVX2 against AVX-512) for the same model.

Besides WER, a *lost run* is a stretch of at least ``LOST_RUN_WORDS``
consecutive words of the script that the transcript skips: a decoding failure
(a window skipped, a chunk's last sentence dropped), not a mishearing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import jiwer

WORD_RE = re.compile(r"[a-z0-9']+")
LOST_RUN_WORDS = 5  # this many script words in a row missing: a skipped stretch, not a mishearing
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
                "nineteen", "twenty")


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
