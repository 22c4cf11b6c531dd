"""Media to Whisper's input, 16 kHz mono samples, decoded as faster-whisper's ``decode_audio`` does."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
from av.audio.fifo import AudioFifo
from av.audio.resampler import AudioResampler

from workers.errors import PermanentJobError

SAMPLE_RATE = 16000  # what Whisper's feature extractor and Silero VAD read
GROUP_SAMPLES = 500_000  # decoded samples resampled at once: faster-whisper's grouping, so the same samples
PCM_SCALE = 32768.0  # signed 16-bit PCM to floats in [-1, 1), as faster-whisper converts


def decode(path: Path, sampling_rate: int = SAMPLE_RATE) -> np.ndarray:
    """The samples faster-whisper's ``decode_audio`` gives for ``path``, with one open of the file.

    Why not ``decode_audio`` itself: it runs a full ``gc.collect()`` after every
    file, against resampler objects an old PyAV left in reference cycles
    (faster-whisper issue #390). The PyAV this project pins leaves none
    (tests/engine/test_audio.py proves it), and a full collection holds the GIL for as
    long as the heap is big, so clips prepared on threads would queue behind it.
    A container without an audio stream (a video-only MP4 sent as a document) is
    a ``PermanentJobError`` here, where decoding it would fail with a bare
    ``IndexError`` that says nothing about the file; PyAV's own errors propagate
    for ``workers.transcribe.failures.classify``.
    """
    with av.open(str(path), mode="r", metadata_errors="ignore") as container:
        if not container.streams.audio:
            raise PermanentJobError("media has no audio stream")
        resampler = AudioResampler(format="s16", layout="mono", rate=sampling_rate)
        fifo = AudioFifo()
        pieces: list[np.ndarray] = []
        frames = container.decode(audio=0)
        while True:
            try:
                frame = next(frames)
            except StopIteration:
                break
            except av.error.InvalidDataError:  # skipped, as decode_audio skips it
                continue
            frame.pts = None  # the fifo checks timestamps; decode_audio ignores them too
            fifo.write(frame)
            if fifo.samples >= GROUP_SAMPLES:
                pieces += [f.to_ndarray() for f in resampler.resample(fifo.read())]
        if fifo.samples:
            pieces += [f.to_ndarray() for f in resampler.resample(fifo.read())]
        pieces += [f.to_ndarray() for f in resampler.resample(None)]  # flush
    pcm = np.concatenate(pieces, axis=None) if pieces else np.zeros(0, dtype=np.int16)
    return pcm.astype(np.float32) / PCM_SCALE
