"""When to post a partial transcript: only when it grew and the interval has passed.

The server stores every progress call and throttles visible Telegram edits
itself; we still avoid sending one per segment, which would be a request per
second of audio on a fast GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ProgressThrottle:
    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last_sent_at: float | None = None
        self._last_len = 0
        self._started_at = clock()

    def should_send(self, text: str) -> bool:
        """True when ``text`` is longer than the last sent one and ``interval_s`` has passed."""
        now = self._clock()
        reference = self._last_sent_at if self._last_sent_at is not None else self._started_at
        if len(text) <= self._last_len or now - reference < self.interval_s:
            return False
        self._last_sent_at, self._last_len = now, len(text)
        return True
