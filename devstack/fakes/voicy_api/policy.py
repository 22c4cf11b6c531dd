"""The server's tunables, parsed exactly as Voicy parses them (reference §3.1, §3.2, §4, §8.19).

Read on every request (from the server's overrides, then the process
environment), so a test can change a value without restarting the server.
JavaScript ``Number()`` semantics matter here: ``""`` and whitespace parse to
0, ``"abc"`` and ``"Infinity"`` are not finite.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_STALE_ACTIVE_JOB_MS = 900_000
DEFAULT_PROGRESS_EDIT_INTERVAL_MS = 2500
MIN_PROGRESS_EDIT_INTERVAL_MS = 1000
DEFAULT_CACHE_TTL_DAYS = 10


def js_number(raw: str) -> float:
    """JavaScript ``Number(raw)`` for environment strings: blank is 0, garbage is NaN.

    Every non-finite spelling (Python's ``inf``/``nan`` or JS ``Infinity``)
    ends up at the same default, so no finer emulation is needed.
    """
    text = raw.strip()
    if not text:
        return 0.0
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return float(int(text, 0)) if text.lower().startswith(("0x", "0o", "0b")) else math.nan
    except ValueError:
        return math.nan


class Policy:
    """One view over overrides + ``os.environ``."""

    def __init__(self, overrides: Mapping[str, str] | None = None) -> None:
        self.overrides: dict[str, str] = dict(overrides or {})

    def get(self, name: str) -> str | None:
        return self.overrides[name] if name in self.overrides else os.environ.get(name)

    def _positive_or_default(self, name: str, default: float) -> float:
        """``Number(env || default)``; a value that is not finite or not > 0 means the default."""
        value = js_number(self.get(name) or str(default))
        return value if math.isfinite(value) and value > 0 else default

    @property
    def max_attempts(self) -> float:
        return self._positive_or_default("VOICY_WORKER_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS)

    @property
    def stale_active_job_ms(self) -> float:
        return self._positive_or_default("VOICY_WORKER_STALE_ACTIVE_JOB_MS", DEFAULT_STALE_ACTIVE_JOB_MS)

    @property
    def progress_edit_interval_ms(self) -> float:
        """Unset or not finite: 2500; otherwise clamped to at least 1000 (``""`` gives 1000)."""
        raw = self.get("VOICY_PROGRESS_EDIT_INTERVAL_MS")
        value = math.nan if raw is None else js_number(raw)
        if not math.isfinite(value):
            return DEFAULT_PROGRESS_EDIT_INTERVAL_MS
        return max(value, MIN_PROGRESS_EDIT_INTERVAL_MS)

    @property
    def publish_disabled(self) -> bool:
        return self.get("VOICY_DISABLE_TELEGRAM_PUBLISH") == "1"

    @property
    def cache_ttl_days(self) -> float:
        return self._positive_or_default("VOICY_TRANSCRIPTION_CACHE_TTL_DAYS", DEFAULT_CACHE_TTL_DAYS)
