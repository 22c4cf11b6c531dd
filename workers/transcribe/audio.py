"""Media to Whisper's input, 16 kHz mono samples, decoded as faster-whisper's ``decode_audio`` does."""

from __future__ import annotations

import gc
from pathlib import Path

import av
import numpy as np
from av.audio.fifo import AudioFifo
from av.audio.resampler import AudioResampler

from workers.errors import PermanentJobError

SAMPLE_RATE = 16000  # what Whisper's feature extractor and Silero VAD read
GROUP_SAMPLES = 500_000  # decoded samples resampled at once: faster-whisper's grouping, so the same samples
PCM_SCALE = 32768.0  # signed 16-bit PCM to floats in [-1, 1), as faster-whisper converts
# gc.collect's generation argument: 0 and 1, the objects made since the collector last ran, not the whole
# heap, so its cost does not grow with the loaded model (docs/BENCHMARKS.md "Decoding").
YOUNG_GENERATIONS = 1


def decode(path: Path, sampling_rate: int = SAMPLE_RATE) -> np.ndarray:
    """The samples faster-whisper's ``decode_audio`` gives for ``path``, with one open of the file.

    Why not ``decode_audio`` itself: it runs a full ``gc.collect()`` after every
    file, against the resampler's filter graph, which PyAV keeps in a reference
    cycle with its filter contexts (faster-whisper issue #390; PyAV 18.1.1 made
    the cycle again, to keep a held context from outliving its graph). A full
    collection holds the GIL for as long as the heap is big, so clips prepared on
    threads would queue behind it. The cycle is made during this call, so a
    collection of the young generations frees it (``YOUNG_GENERATIONS``;
    tests/engine/test_audio.py proves it leaves nothing for a full one).
    A container without an audio stream (a video-only MP4 sent as a document) is
    a ``PermanentJobError`` here, where decoding it would fail with a bare
    ``IndexError`` that says nothing about the file; PyAV's own errors propagate
    for ``workers.transcribe.failures.classify``.
    """
    pcm = _pcm(path, sampling_rate)
    gc.collect(YOUNG_GENERATIONS)  # the resampler is unreferenced now: its graph's cycle goes
    return pcm.astype(np.float32) / PCM_SCALE


def _pcm(path: Path, sampling_rate: int) -> np.ndarray:
    """Signed 16-bit mono samples at ``sampling_rate``, resampled in faster-whisper's groups."""
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
    return np.concatenate(pieces, axis=None) if pieces else np.zeros(0, dtype=np.int16)
