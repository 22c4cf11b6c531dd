"""The engine seam: what every transcription engine offers, whatever runs the model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from workers.transcribe.results import EngineInfo, Transcript

OnSegment = Callable[[Transcript], None]
# Whisper's window: a recording up to this long is decoded in one pass, so it can share a batch.
CLIP_WINDOW_S = 30.0


# Per clip, in order: its transcript; the exception that ended it (a decoding error, or one its
# ``on_segment`` raised); or ``None``: not answered from the batch (longer than one window, or a
# decode that ``transcribe`` would retry or skip), so the caller transcribes it on its own.
ClipOutcome = Transcript | Exception | None
OnDone = Callable[[Transcript | Exception], None]


@dataclass(frozen=True)
class Clip:
    """One short recording of a batch: its file, its language hint, its own progress callback, and
    ``on_done``, called with its outcome as soon as its pass ends (not for ``None``), so its result
    need not wait for the passes after it."""

    path: Path
    language: str | None = None  # the job's hint; the engine applies the language rule per clip
    on_segment: OnSegment | None = None
    on_done: OnDone | None = None


MoreClips = Callable[[], Sequence[Clip]]  # clips that became ready since: asked while each pass decodes


@runtime_checkable
class TranscriptionEngine(Protocol):
    """A loaded model that turns a media file into a :class:`Transcript`.

    Built once per process as ``cls(settings, pool_processes)`` and found by name in
    ``workers.transcribe.registry``. Errors are the project's tree (``workers.errors``): ``PermanentJobError``
    for media no retry can decode, ``RetryableJobError`` for the rest; an exception raised by ``on_segment``
    (a lost lease) propagates unchanged."""

    name: str  # the registry name this engine is selected by

    @property
    def metadata(self) -> EngineInfo:
        """The model's name, the device and the compute type it runs with."""
        ...

    def transcribe(self, path: Path, language: str | None = None,
                   on_segment: OnSegment | None = None) -> Transcript:
        """Decode ``path`` in ``language`` (``None``: detect), calling ``on_segment`` as it grows."""
        ...


@runtime_checkable
class ClipBatchingEngine(TranscriptionEngine, Protocol):
    """An engine that also transcribes several short clips in one batched pass.

    The caller checks for it with ``isinstance``; an engine without it transcribes every job on its own.
    One clip's failure is that clip's alone."""

    @property
    def max_clips(self) -> int:
        """Clips decoded in one pass (``VOICY_WORKER_CLIP_BATCH_SIZE``); 1 or less: it does not batch."""
        ...

    def transcribe_clips(self, clips: Sequence[Clip], more: MoreClips | None = None) -> list[ClipOutcome]:
        """One outcome per clip, in order (``clips``, then each clip ``more`` returned, as it returned
        them); the words of each as ``transcribe`` alone would give them. ``more`` is asked on a thread of
        its own while each pass decodes (never twice at once), so neither it nor the preparation of the
        clips it returns holds a pass up; it bounds itself."""
        ...
