"""``workers.transcribe.audio.decode``: faster-whisper's samples, without its per-file garbage collection.

Real media: the committed fixtures (Opus in Ogg), and the same speech written
as 44.1 kHz stereo MP3 and WAV (resampled and downmixed, and long enough to
be resampled in more than one group).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
from faster_whisper.audio import decode_audio

from devstack.fakes.synth_media import write_video_only_mp4
from devstack.infra.stack import AUDIO_DIR, ROOT
from workers.errors import PermanentJobError
from workers.transcribe.audio import GROUP_SAMPLES, decode

STEREO_RATE = 44100
FRAME_SAMPLES = 44100
PCM_PEAK = 20000
DECODE_TIMEOUT_S = 60.0


def write_stereo(path: Path, codec: str, fmt: str) -> Path:
    speech = decode_audio(str(AUDIO_DIR / "story.ogg"), sampling_rate=STEREO_RATE)
    pcm = (speech[:GROUP_SAMPLES + STEREO_RATE] * PCM_PEAK).astype(np.int16)
    assert len(pcm) > GROUP_SAMPLES  # resampled in more than one group
    with av.open(str(path), "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=STEREO_RATE, layout="stereo")
        assert isinstance(stream, av.AudioStream)
        for start in range(0, len(pcm) - FRAME_SAMPLES, FRAME_SAMPLES):
            piece = pcm[start:start + FRAME_SAMPLES]
            frame = av.AudioFrame.from_ndarray(np.stack([piece, piece]).T.reshape(1, -1), format="s16",
                                               layout="stereo")
            frame.sample_rate = STEREO_RATE
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("media")
    return [*sorted(p for p in AUDIO_DIR.glob("*.ogg") if p.name != "undecodable.ogg"),
            write_stereo(folder / "story.mp3", "libmp3lame", "mp3"),
            write_stereo(folder / "story.wav", "pcm_s16le", "wav")]


def test_the_samples_are_faster_whispers_own(media: list[Path]) -> None:
    for path in media:
        ours, theirs = decode(path), decode_audio(str(path))
        assert ours.dtype == theirs.dtype == np.float32
        assert np.array_equal(ours, theirs), path.name


# Decodes each file given and prints any whose decode left garbage for a full collection, with the count.
DECODE_GARBAGE = """
import gc, sys
from pathlib import Path
from workers.transcribe.audio import decode
decode(Path(sys.argv[1]))  # the first decode imports and sets up PyAV's codecs
gc.collect()
for name in sys.argv[1:]:
    decode(Path(name))
    if found := gc.collect():
        print(Path(name).name, found)
"""


def test_a_decode_leaves_nothing_for_the_garbage_collector(media: list[Path]) -> None:
    """Why decode's collection of the young generations may stand for faster-whisper's full one after each
    file: the resampler's graph cycle (PyAV 18.1.1) is gone when decode returns.

    In a process of its own, so that nothing else an xdist worker runs meanwhile (its other threads, a
    collection its own allocations start) is counted as the decode's, or collects the decode's garbage."""
    done = subprocess.run([sys.executable, "-c", DECODE_GARBAGE, *map(str, media)], cwd=ROOT, capture_output=True,
                          text=True, timeout=DECODE_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "", done.stdout  # each line: a file whose decode left garbage, and how much


def test_media_without_audio_or_undecodable_fails_as_before(tmp_path: Path) -> None:
    with pytest.raises(PermanentJobError, match="no audio stream"):
        decode(write_video_only_mp4(tmp_path / "screen.mp4"))
    with pytest.raises(av.error.FFmpegError):
        decode(AUDIO_DIR / "undecodable.ogg")
    with pytest.raises(FileNotFoundError):
        decode(tmp_path / "missing.ogg")
