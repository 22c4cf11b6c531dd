"""The engine seam: what every transcription engine offers, whatever runs the model.

An engine is built once per process from :class:`~workers.transcribe.settings.EngineSettings`
and the number of pool processes sharing the host's cores, i.e. its class is
called as ``cls(settings, pool_processes)``, and is found by name in
``workers.transcribe.registry``. Everything else the pipeline needs is here:
``transcribe`` streams a growing :class:`Transcript` to ``on_segment`` and
returns the final one; ``metadata`` says which model ran where.

Errors are the project's tree (``workers.errors``): ``PermanentJobError`` for
media no retry can decode, ``RetryableJobError`` for the rest, and an
exception raised by ``on_segment`` (a lost lease) propagates unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from workers.transcribe.results import EngineInfo, Transcript

OnSegment = Callable[[Transcript], None]


@runtime_checkable
class TranscriptionEngine(Protocol):
    """A loaded model that turns a media file into a :class:`Transcript`."""

    name: str  # the registry name this engine is selected by

    @property
    def metadata(self) -> EngineInfo:
        """The model's name, the device and the compute type it runs with."""
        ...

    def transcribe(self, path: Path, language: str | None = None,
                   on_segment: OnSegment | None = None) -> Transcript:
        """Decode ``path`` in ``language`` (``None``: detect), calling ``on_segment`` as it grows."""
        ...
