"""When to post a partial transcript: only when it grew and the interval has passed."""

from __future__ import annotations

import time
from collections.abc import Callable

from workers.voicy.settings import VoicySettings


class ProgressThrottle:
    """Decide per partial transcript whether to send it; ``clock`` is injectable for tests.

    The server stores every progress call and throttles Telegram edits itself (reference/voicy.md
    §4), but the contract asks for "meaningful transcript changes" only. The first post waits one
    interval from the start, so a short voice goes straight to its result; the boundary itself is
    allowed (``>=``), like the server's throttle.
    """

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last_sent_at: float | None = None
        self._last_len = 0
        self._started_at = clock()

    @classmethod
    def from_settings(cls, settings: VoicySettings,
                      clock: Callable[[], float] = time.monotonic) -> ProgressThrottle:
        """``VOICY_WORKER_PROGRESS_INTERVAL_MS`` (already clamped to at least 1000 ms)."""
        return cls(settings.progress_interval_s, clock)

    def should_send(self, text: str) -> bool:
        """True when ``text`` is longer than the last sent one and ``interval_s`` has passed."""
        now = self._clock()
        reference = self._last_sent_at if self._last_sent_at is not None else self._started_at
        if len(text) <= self._last_len or now - reference < self.interval_s:
            return False
        self._last_sent_at, self._last_len = now, len(text)
        return True
