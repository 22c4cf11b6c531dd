"""The sequential engine's verdict on one window's decode: keep it, retry it hotter, or skip it as silence."""

from __future__ import annotations

from faster_whisper.transcribe import get_compression_ratio

# faster-whisper's defaults for ``WhisperModel.transcribe``, which the sequential engine uses. A window
# decoded more repetitively (gzip ratio) or less likely (mean log-probability per token) than this is
# decoded again at a higher temperature; one that is also likely silent is skipped instead.
COMPRESSION_RATIO_THRESHOLD = 2.4
LOG_PROB_THRESHOLD = -1.0
NO_SPEECH_THRESHOLD = 0.6  # no-speech probability above which an unlikely window counts as silence


def would_retry(text: str, avg_logprob: float) -> bool:
    """True when the sequential engine would not keep this decode as it is (too repetitive or too
    unlikely). A batched pass has no temperature fallback, so such a window is decoded again alone."""
    if not text.strip():
        return False
    repetitive = get_compression_ratio(text.strip()) > COMPRESSION_RATIO_THRESHOLD
    return repetitive or avg_logprob < LOG_PROB_THRESHOLD


def silent(no_speech_prob: float, avg_logprob: float) -> bool:
    """The sequential engine's skip rule: the window likely holds no speech and its decode is unlikely."""
    return no_speech_prob > NO_SPEECH_THRESHOLD and avg_logprob <= LOG_PROB_THRESHOLD
