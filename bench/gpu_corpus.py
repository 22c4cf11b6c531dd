"""The GPU bench's inputs as a folder that can be carried: the burst's voices, a long recording, their scripts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

INDEX = "corpus.json"
VOICES_DIR = "voices"
DEFAULT_VOICES = 48  # bench voicy-burst's burst
LONG_MINUTES = 3.5  # the engine bench's recording cut at four rounds of the fixtures: 227 s


@dataclass(frozen=True)
class Item:
    """A file of the corpus and what was said in it."""

    path: Path
    seconds: float
    script: str


@dataclass(frozen=True)
class Corpus:
    voices: list[Item]
    long: Item


def write(folder: Path, voices: int = DEFAULT_VOICES, minutes: float = LONG_MINUTES) -> Corpus:
    """Generate the corpus into ``folder`` (needs this repository's fixtures and dev stack, not a GPU):
    ``bench voicy-burst``'s seeded voices and ``bench engine``'s recording, with ``corpus.json``."""
    # Function-level: the generators import the dev stack (fixtures, PyAV synthesis), which a GPU host
    # reading a carried corpus (``read``) neither has nor needs.
    from bench.recordings import long_recording
    from bench.voicy_burst import make_voices

    folder.mkdir(parents=True, exist_ok=True)
    made = make_voices(folder / VOICES_DIR, voices)
    recording = long_recording(folder, minutes)
    index = {"voices": [{"file": str(v.path.relative_to(folder)), "seconds": v.seconds, "script": v.script}
                        for v in made],
             "long": {"file": recording.path.name, "seconds": round(recording.duration_s, 2),
                      "script": recording.script}}
    (folder / INDEX).write_text(json.dumps(index, indent=1))
    return read(folder)


def read(folder: Path, voices: int | None = None) -> Corpus:
    """A corpus written by :func:`write` (copied as it is), its first ``voices`` voices."""
    index = json.loads((folder / INDEX).read_text())
    items = [Item(folder / v["file"], float(v["seconds"]), v["script"]) for v in index["voices"]]
    long = index["long"]
    return Corpus(items[:voices] if voices else items, Item(folder / long["file"], float(long["seconds"]),
                                                            long["script"]))

