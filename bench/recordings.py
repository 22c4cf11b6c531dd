"""Recordings whose script is known, made from the committed speech fixtures: what the word benches hear.

Why generated and not committed: the fixtures (tests/fixtures/audio, a few KB
each, spoken by espeak-ng from the texts in their manifest) are the only
speech we have offline; every longer recording is those clips joined, so its
script is their texts joined the same way. Nothing here is a large binary.

* each fixture alone (``clips``);
* the demo's long message (``devstack.demo.long_message``: the story three
  times, then every short clip; 124 s), where the demo lost 39 words;
* the engine bench's recording (``long_recording``: every clip in turn with
  ``GAP_S`` of silence, repeated to ``minutes``; 340 s at 5 minutes);
* ``perturbed``: a recording at another level with faint noise, the kind of
  small change another CPU's kernels make to the model's numbers. A decoding
  failure that depends on those numbers shows on some of these copies.
"""

from __future__ import annotations

import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from faster_whisper.audio import decode_audio

from devstack.demo import LONG_MESSAGE_STORIES, long_message
from devstack.infra.stack import AUDIO_DIR, audio_manifest

SAMPLE_RATE = 16000
GAP_S = 0.6  # silence between joined fixtures in the engine bench's recording: a pause VAD can cut at
PCM_MAX = 32767
SECONDS_PER_MINUTE = 60.0
UNDECODABLE = "undecodable.ogg"
# The perturbed copies: every (gain, noise amplitude) here with each noise draw in PERTURBATION_DRAWS,
# the noise being the draw-th array from numpy's default_rng(NOISE_SEED). Levels and noise a real
# microphone varies by; with the previous-text prompt the sequential engine skipped 39 words of the
# demo's message on 3 of the first 16 such copies (docs/BENCHMARKS.md "Words").
NOISE_SEED = 0
PERTURBATION_LEVELS = ((0.8, 0.002), (1.2, 0.005), (1.0, 0.003))
PERTURBATION_DRAWS = range(5)
PERTURBATIONS = tuple((gain, noise, draw) for draw in PERTURBATION_DRAWS for gain, noise in PERTURBATION_LEVELS)

@dataclass(frozen=True)
class Recording:
    """A file to transcribe and what was said in it."""

    name: str
    path: Path
    script: str
    duration_s: float


def speech_fixtures() -> list[dict]:
    """The manifest's speech clips (name, file, text, duration_s), in file-name order."""
    return sorted((m for m in audio_manifest() if m["file"] != UNDECODABLE), key=lambda m: m["file"])


def clips() -> list[Recording]:
    return [Recording(m["name"], AUDIO_DIR / m["file"], m["text"], m["duration_s"]) for m in speech_fixtures()]


def write_wav(path: Path, audio: np.ndarray) -> Path:
    """16-bit mono WAV at 16 kHz."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes((np.clip(audio, -1.0, 1.0) * PCM_MAX).astype("<i2").tobytes())
    return path


def demo_long_message(directory: Path) -> Recording:
    """The demo's two-minute message, byte for byte, and its script."""
    items = audio_manifest()
    data, duration_s = long_message(items)
    longest = max(items, key=lambda m: m["duration_s"])
    order = [longest] * LONG_MESSAGE_STORIES + [m for m in items if m is not longest]
    path = directory / "demo-long.wav"
    path.write_bytes(data)
    return Recording("demo long message", path, " ".join(m["text"] for m in order), duration_s)


def long_recording(directory: Path, minutes: float) -> Recording:
    """Every speech fixture in turn with ``GAP_S`` of silence, repeated until ``minutes`` long."""
    items = speech_fixtures()
    audio = [decode_audio(str(AUDIO_DIR / m["file"]), sampling_rate=SAMPLE_RATE) for m in items]
    gap = np.zeros(int(GAP_S * SAMPLE_RATE), dtype=np.float32)
    pieces: list[np.ndarray] = []
    texts: list[str] = []
    total = 0
    while total < minutes * SECONDS_PER_MINUTE * SAMPLE_RATE:
        for clip, item in zip(audio, items):
            pieces += [clip, gap]
            texts.append(item["text"])
            total += len(clip) + len(gap)
    joined = np.concatenate(pieces)
    path = write_wav(directory / f"long-{minutes:g}min.wav", joined)
    return Recording(f"{len(joined) / SAMPLE_RATE:.0f} s recording", path, " ".join(texts),
                     len(joined) / SAMPLE_RATE)


def perturbed(base: Recording, directory: Path, gain: float, noise: float, draw: int) -> Recording:
    """``base`` at ``gain`` plus white noise of amplitude ``noise`` (the ``draw``-th of
    ``default_rng(NOISE_SEED)``): the same script."""
    audio = decode_audio(str(base.path), sampling_rate=SAMPLE_RATE)
    rng = np.random.default_rng(NOISE_SEED)
    for _ in range(draw):
        rng.standard_normal(len(audio))
    changed = audio * gain + noise * rng.standard_normal(len(audio)).astype(np.float32)
    path = write_wav(directory / f"{base.path.stem}-g{gain:g}-n{noise:g}-d{draw}.wav", changed)
    return Recording(f"{base.name} ×{gain:g} +noise {noise:g} (draw {draw})", path, base.script, base.duration_s)
