"""A recording's length from its container, read without decoding it (milliseconds, no model).

Why: a gpu slot batches only recordings that fit one 30 s window, and must
know which ones do *before* it takes their leases (``workers.voicy.gather``);
decoding every candidate to find out would cost what batching saves. The io
task reads the length once, right after the download, and the job's record
carries it. A container that does not state its length, or cannot be read at
all, gives ``None``: such a job may still join a batch, where decoding either
fails it alone or finds it too long and leaves it to be transcribed on its own.

PyAV is imported by the call, not the module: every fleet process imports this module (``tasks``
registers the Voicy pipeline everywhere), but only the io and gpu workers probe media. The bridges,
beat, the Cairn pools and the CLI verbs would pay PyAV's import (~70 ms of CPU) at every start for
nothing; ``make test`` starts a few hundred of them.
"""

from __future__ import annotations

from pathlib import Path

SECONDS_DIGITS = 3


def media_seconds(path: Path) -> float | None:
    """The container's duration in seconds, else its first audio stream's, else ``None``."""
    import av

    try:
        with av.open(str(path), metadata_errors="ignore") as container:
            if container.duration:
                return round(container.duration / av.time_base, SECONDS_DIGITS)
            for stream in container.streams.audio:
                if stream.duration and stream.time_base:
                    return round(float(stream.duration * stream.time_base), SECONDS_DIGITS)
    except (av.error.FFmpegError, OSError, ValueError):
        return None
    return None
