"""What two transcriptions of one recording share on every CPU: the words and where they are said.

Two engines (or one engine alone and in a batch) decode the same audio through different
CTranslate2 kernels: a batch pads its windows, and the machine's vector extensions (AVX2 against
AVX-512) change the float rounding. Most runs agree to the character; but a comma or a capital
can move between machines (a fresh clone on an AVX2-only box read ``Hello, everyone`` where this
box reads ``Hello everyone``). Tests that compare two decodes therefore compare the normalised
words (:func:`bench.words.normalise`: case, punctuation and small numbers folded) and the
segments' timing, never the punctuation.
"""
from __future__ import annotations

from bench.words import normalise
from workers.transcribe.results import Transcript

PART_START_TOLERANCE_S = 1.0  # the same segment may start a frame or two apart between kernels


def assert_same_words(one: Transcript, other: Transcript, label: object = "") -> None:
    """``other`` says the words ``one`` says, in segments that start where ``one``'s start."""
    assert normalise(other.text) == normalise(one.text) and normalise(one.text), (label, one.text, other.text)
    assert len(other.parts) == len(one.parts), (label, one.parts, other.parts)
    for mine, theirs in zip(one.parts, other.parts):
        assert abs(mine.start - theirs.start) <= PART_START_TOLERANCE_S, (label, mine, theirs)
        assert normalise(mine.text) == normalise(theirs.text), (label, mine, theirs)
