"""How a decoding or inference failure maps to the project's error tree, for every engine."""

from __future__ import annotations

import av

from workers.errors import JobError, PermanentJobError, RetryableJobError


def classify(exc: Exception) -> Exception:
    """Map a decoding/inference error to our tree; messages carry no path (PyAV quotes it).

    Undecodable media (PyAV/FFmpeg errors) is permanent, as is media with no audio stream
    (``workers.transcribe.audio.decode`` says so before decoding): no retry decodes it. A missing
    file, running out of memory and anything unexpected are retryable.
    """
    if isinstance(exc, JobError):  # already classified (no audio stream)
        return exc
    name = type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return RetryableJobError(f"media file is missing: {name}")
    if isinstance(exc, av.error.FFmpegError):
        return PermanentJobError(f"media could not be decoded: {name}")
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        return RetryableJobError(f"transcription ran out of memory: {name}")
    return RetryableJobError(f"transcription failed: {name}")
