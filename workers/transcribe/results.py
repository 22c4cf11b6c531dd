"""What an engine returns: typed segments, language, duration and the engine's own metadata."""

from __future__ import annotations

from dataclasses import dataclass, field

SECONDS_PER_MINUTE = 60
DURATION_DIGITS = 3  # a transcript's duration is reported to the millisecond


def time_code(seconds: float) -> str:
    """``MM:SS`` of a segment start (minutes keep growing past 99)."""
    minutes, secs = divmod(max(0, int(seconds)), SECONDS_PER_MINUTE)
    return f"{minutes:02d}:{secs:02d}"


@dataclass(frozen=True)
class Segment:
    """One decoded stretch of speech: where it starts and ends (seconds) and its text."""

    start: float
    end: float
    text: str

    @property
    def time_code(self) -> str:
        return time_code(self.start)


@dataclass(frozen=True)
class EngineInfo:
    """Which model ran where: the model's *name* (never a local path), device and compute type."""

    model: str
    device: str
    compute_type: str


@dataclass
class Transcript:
    """The transcript so far (partial while streaming, final at the end).

    A plain dataclass, not Voicy's wire model: the engine seam knows nothing of who asked. Voicy turns it
    into its ``progress``/``result`` body on its own side (``workers.voicy.bodies``).

    ``parts`` is the same list as ``segments``: a part, in Voicy's words, is a
    segment shown with its time code.
    """

    segments: list[Segment] = field(default_factory=list)
    language: str | None = None
    duration: float | None = None  # seconds of audio, before VAD

    @property
    def parts(self) -> list[Segment]:
        return self.segments

    @property
    def text(self) -> str:
        return " ".join(s.text for s in self.segments if s.text).strip()
