"""A recording's length from its container, read without decoding it (no model)."""

from __future__ import annotations

from pathlib import Path

SECONDS_DIGITS = 3


def media_seconds(path: Path) -> float | None:
    """The container's duration in seconds, else its first audio stream's, else ``None``.

    A gpu slot batches only recordings that fit one 30 s window and must know which do before it takes
    their leases (``workers.voicy.gather``); decoding every candidate would cost what batching saves, so the
    io task reads the length once after the download. ``None`` (unstated or unreadable) may still join a
    batch, where decoding fails it alone or finds it too long and leaves it to run on its own."""
    # Imported by the call: every fleet process imports this module (``tasks`` registers the Voicy
    # pipeline everywhere), but only the io and gpu workers probe media; the rest would pay for PyAV.
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
