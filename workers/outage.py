"""Riding out a Redis or NATS outage: say so once, back off, say when it is over (R1).

Used by the Cairn bridge (every Redis and NATS failure of its loop) and by the
provider pool's NATS connection (``workers.cairn.nats_conn``).

Why a tracker and not a log line at each failure: during an outage every held
message fails its lease read once a second, every ``in_progress`` tick fails,
the result pub/sub retries, the pull loops retry. Logged one by one, a 60 s
Redis restart under 16 held messages is a thousand warnings that bury the one
fact the operator needs ("Redis is unavailable since 10:02:13"). So each
failure is *reported* here: the first one of an outage is logged as a warning
naming the service and what failed, the rest at DEBUG, and the first success
afterwards logs once how long it lasted.

Failures seen here are never a verdict on a job. A lease or ledger read that
fails means "unknown": the caller keeps waiting (C4); only a read that
*succeeds* and says the task is gone may NAK it as lost. :attr:`Outage.last_seen`
lets a waiter that lived through an outage give a task that could not renew
its lease meanwhile a little more grace before it calls it lost.
"""

from __future__ import annotations

import logging
import time

import redis.exceptions

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 5.0  # a restarted service is noticed within this, and a 60 s outage costs ~15 retries

# Errors that mean "Redis is not there right now" (also raised by redis.asyncio), never a bug of ours.
REDIS_UNAVAILABLE: tuple[type[BaseException], ...] = (redis.exceptions.ConnectionError,
                                                      redis.exceptions.TimeoutError,
                                                      redis.exceptions.BusyLoadingError,
                                                      redis.exceptions.ReadOnlyError,
                                                      ConnectionError, OSError, TimeoutError)


def backoff_s(attempt: int) -> float:
    """Exponential backoff, capped: 0.5, 1, 2, 4, 5, 5, ... seconds."""
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * (2 ** max(0, attempt)))


class Outage:
    """The availability of one service as this process sees it (one instance per service)."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.down_since: float | None = None  # monotonic
        self.last_seen = float("-inf")  # monotonic time of the last failure (an outage ending is "seen")
        self.outages = 0

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, what: str, exc: BaseException | None = None) -> None:
        """One operation failed because the service is unreachable; logs only the first of an outage."""
        now = time.monotonic()
        self.last_seen = now
        cause = type(exc).__name__ if exc is not None else "unreachable"
        if self.down_since is None:
            self.down_since = now
            self.outages += 1
            log.warning("%s unavailable (%s: %s); retrying with backoff until it is back",
                        self.service, what, cause)
        else:
            log.debug("%s still unavailable (%s: %s)", self.service, what, cause)

    def ok(self) -> None:
        """An operation succeeded: if the service was down, log once that it is back."""
        if self.down_since is not None:
            now = time.monotonic()
            log.warning("%s available again after %.1fs", self.service, now - self.down_since)
            self.down_since = None
            self.last_seen = now

    def recently(self, window_s: float) -> bool:
        """True while the service is down, or was within the last ``window_s`` seconds."""
        return self.down or time.monotonic() - self.last_seen < window_s
