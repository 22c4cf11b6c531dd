"""How a decoding or inference failure maps to the project's error tree, for every engine."""

from __future__ import annotations

from pathlib import Path

import av

from workers.errors import JobError, PermanentJobError, RetryableJobError


def require_audio_stream(path: Path) -> None:
    """Raise ``PermanentJobError`` unless the container at ``path`` has an audio stream.

    Opening the container twice costs milliseconds; decoding a file with no
    audio (a video-only MP4 sent as a ``video`` or ``document``) would fail on
    every retry with faster-whisper's bare ``IndexError``, which says nothing
    about the file. Errors opening it are left to :func:`classify` (a missing
    file stays retryable).
    """
    with av.open(str(path), metadata_errors="ignore") as container:
        has_audio = bool(container.streams.audio)
    if not has_audio:
        raise PermanentJobError("media has no audio stream")


def classify(exc: Exception) -> Exception:
    """Map a decoding/inference error to our tree; messages carry no path (PyAV quotes it).

    Undecodable media is permanent; a missing file, running out of memory and anything unexpected retry."""
    if isinstance(exc, JobError):  # already classified (require_audio_stream)
        return exc
    name = type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return RetryableJobError(f"media file is missing: {name}")
    if isinstance(exc, av.error.FFmpegError):
        return PermanentJobError(f"media could not be decoded: {name}")
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        return RetryableJobError(f"transcription ran out of memory: {name}")
    return RetryableJobError(f"transcription failed: {name}")
