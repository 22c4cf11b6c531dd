"""Tiny media files made on the fly with PyAV, for cases the audio fixtures do not cover.

Why generated, not committed: a few hundred bytes written in milliseconds, and
the generator documents exactly what the file holds.
"""

from __future__ import annotations

from pathlib import Path

VIDEO_CODEC = "mpeg4"  # in every FFmpeg build PyAV ships with
VIDEO_SIDE_PX = 16
VIDEO_FPS = 5
VIDEO_FRAMES = 3


def write_video_only_mp4(path: Path) -> Path:
    """An MP4 with one short video stream and **no audio stream** (a silent screen recording)."""
    import av
    import numpy as np

    black = np.zeros((VIDEO_SIDE_PX, VIDEO_SIDE_PX, 3), dtype=np.uint8)
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream(VIDEO_CODEC, rate=VIDEO_FPS)
        stream.width = stream.height = VIDEO_SIDE_PX
        stream.pix_fmt = "yuv420p"
        for _ in range(VIDEO_FRAMES):
            out.mux(stream.encode(av.VideoFrame.from_ndarray(black, format="rgb24")))
        out.mux(stream.encode())  # flush the encoder
    return path
