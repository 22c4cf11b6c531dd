"""Media files made on the fly with PyAV, for loads and cases the committed fixtures do not cover.

Why generated, not committed: a few hundred bytes (or a few KB of speech) written
in milliseconds, and the generator documents exactly what the file holds.

* ``write_video_only_mp4``: an MP4 with no audio stream (a silent screen recording).
* ``write_speech_ogg``: a voice message of a chosen length, spoken by the
  committed speech fixtures back to back (real speech, so Whisper has words to
  find and the transcription takes as long as a real message of that length).
* ``write_repeated_speech_ogg``: one fixture sentence said over and over, text
  too repetitive for Whisper's decoder to keep as it is (faster-whisper's
  compression-ratio test): the sequential engine decodes it again at a higher
  temperature, a batched pass cannot.
"""

from __future__ import annotations

import random
from pathlib import Path

import av
import numpy as np

from devstack.infra.stack import AUDIO_DIR, audio_manifest

VIDEO_CODEC = "mpeg4"  # in every FFmpeg build PyAV ships with
VIDEO_SIDE_PX = 16
VIDEO_FPS = 5
VIDEO_FRAMES = 3

SAMPLE_RATE_HZ = 16_000  # what Whisper consumes; Telegram voice notes are speech-grade
OPUS_BITRATE_BPS = 24_000  # as tests/fixtures/audio/make_fixtures.py
PAUSE_BETWEEN_SENTENCES_S = 0.4
OPUS_FRAME_SAMPLES = 960  # 20 ms at 48 kHz; PyAV's encoder takes any frame size, this keeps frames small


def write_video_only_mp4(path: Path) -> Path:
    """An MP4 with one short video stream and **no audio stream** (a silent screen recording)."""
    black = np.zeros((VIDEO_SIDE_PX, VIDEO_SIDE_PX, 3), dtype=np.uint8)
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream(VIDEO_CODEC, rate=VIDEO_FPS)
        assert isinstance(stream, av.VideoStream)
        stream.width = stream.height = VIDEO_SIDE_PX
        stream.pix_fmt = "yuv420p"
        for _ in range(VIDEO_FRAMES):
            out.mux(stream.encode(av.VideoFrame.from_ndarray(black, format="rgb24")))
        out.mux(stream.encode())  # flush the encoder
    return path


def _decode_mono(path: Path) -> np.ndarray:
    """The file's audio as mono s16 samples at ``SAMPLE_RATE_HZ``."""
    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE_HZ)
    chunks: list[np.ndarray] = []
    with av.open(str(path)) as src:
        for frame in src.decode(audio=0):
            chunks.extend(r.to_ndarray().reshape(-1) for r in resampler.resample(frame))
    chunks.extend(r.to_ndarray().reshape(-1) for r in resampler.resample(None))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)


class SpeechSynth:
    """Builds voice messages of a given length from the short speech fixtures (decoded once)."""

    def __init__(self, max_sentence_s: float = 10.0) -> None:
        items = [m for m in audio_manifest() if m["duration_s"] <= max_sentence_s]
        self.sentences = [_decode_mono(AUDIO_DIR / m["file"]) for m in items]
        self.texts = [m["text"] for m in items]

    def samples(self, seconds: float, rng: random.Random) -> tuple[np.ndarray, list[str]]:
        """Sentences picked by ``rng`` with short pauses until at least ``seconds`` (and their texts)."""
        pause = np.zeros(int(PAUSE_BETWEEN_SENTENCES_S * SAMPLE_RATE_HZ), dtype=np.int16)
        parts: list[np.ndarray] = []
        texts: list[str] = []
        total = 0
        while total < seconds * SAMPLE_RATE_HZ:
            i = rng.randrange(len(self.sentences))
            parts.extend((self.sentences[i], pause))
            texts.append(self.texts[i])
            total += len(self.sentences[i]) + len(pause)
        return np.concatenate(parts), texts

    def write_ogg(self, path: Path, seconds: float, rng: random.Random) -> tuple[float, list[str]]:
        """Write an OGG/Opus voice message of about ``seconds``; (its duration in s, its sentences)."""
        pcm, texts = self.samples(seconds, rng)
        with av.open(str(path), "w", format="ogg") as out:
            stream = out.add_stream("libopus", rate=SAMPLE_RATE_HZ, layout="mono")
            stream.bit_rate = OPUS_BITRATE_BPS
            for start in range(0, len(pcm), OPUS_FRAME_SAMPLES):
                chunk = pcm[start:start + OPUS_FRAME_SAMPLES].reshape(1, -1)
                frame = av.AudioFrame.from_ndarray(chunk, format="s16", layout="mono")
                frame.sample_rate = SAMPLE_RATE_HZ
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)
        return round(len(pcm) / SAMPLE_RATE_HZ, 2), texts


def write_speech_ogg(path: Path, seconds: float, seed: int = 0) -> float:
    """One voice message of about ``seconds`` of speech at ``path``; its duration in seconds."""
    return SpeechSynth().write_ogg(path, seconds, random.Random(seed))[0]


class _Always(random.Random):
    """A ``Random`` whose every ``randrange`` gives ``value``: ``SpeechSynth`` then says one sentence only."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def randrange(self, *_: object, **__: object) -> int:
        return self.value


def write_repeated_speech_ogg(path: Path, seconds: float, sentence: int = 0) -> Path:
    """A voice message of about ``seconds`` saying the ``sentence``-th short fixture over and over."""
    SpeechSynth().write_ogg(path, seconds, _Always(sentence))
    return path
