"""Riding out a Redis or NATS outage: say so once, back off, say when it is over (R1)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis.exceptions

from workers.logs import describe

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 5.0  # a restarted service is noticed within this, and a 60 s outage costs ~15 retries
LOOP_BACKOFF_MAX_S = 10.0  # one loop polling Redis (Voicy bridge, beat): a 60 s outage is noticed as over within ~10 s
# Just after a recovery, a failure may be a blip rather than a new outage: after a restart, each pooled
# connection opened before it fails once on its first use ("Connection closed by server"). So within SAME_OUTAGE_S of a
# recovery a failure is logged at DEBUG, and becomes the outage's warning only if failures go on for
# BLIP_S (a new outage is then reported that much later; a blip ends before it).
SAME_OUTAGE_S = 5.0
BLIP_S = 1.0

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
    """The availability of one service as this process sees it (one instance per service).

    A tracker, not a log line per failure: during an outage every held lease, ``in_progress``
    tick and pull loop fails at once, and the one fact the operator needs ("Redis is unavailable
    since 10:02:13") must not be buried. A failure seen here is never a verdict on a job: a read
    that fails means "unknown" and the caller keeps waiting (C4).

    Two wordings, one behaviour. By default each failure names the operation that
    failed (the Cairn bridge and provider pool: many operations share one
    service). With ``loop`` the outage is one loop's (the Voicy bridge, beat):
    the warning names the setting that points at the service (``setting``, e.g.
    ``REDIS_URL``) and the recovery says the loop resumed. Either way
    :meth:`failed` returns how long to wait before the next try (doubling from
    ``initial_s`` up to ``max_s``), and :meth:`ok` starts the backoff over.
    Within ``SAME_OUTAGE_S`` of a recovery, a failure is a possible blip
    (DEBUG); it is reported as an outage once failures have lasted ``BLIP_S``.
    """

    def __init__(self, service: str, logger: logging.Logger = log, *, loop: str | None = None,
                 setting: str | None = None, initial_s: float = BACKOFF_FIRST_S,
                 max_s: float = BACKOFF_MAX_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.service = service
        self.loop = loop
        self.setting = setting
        self._log = logger
        self._initial_s, self._max_s = initial_s, max_s
        self._next_s = initial_s
        self._clock = clock
        self.down_since: float | None = None  # monotonic
        self._recovered_at = float("-inf")  # monotonic time of the last recovery
        self._blip: tuple[str, BaseException | None] | None = None  # a possible blip's first failure
        self.last_seen = float("-inf")  # monotonic time of the last failure (an outage ending is "seen")
        self.outages = 0

    @classmethod
    def redis_loop(cls, loop: str, logger: logging.Logger = log) -> Outage:
        """One long-running loop's view of ``REDIS_URL`` (the Voicy bridge, beat): backoff up to 10 s."""
        return cls("Redis", logger, loop=loop, setting="REDIS_URL", max_s=LOOP_BACKOFF_MAX_S)

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, what: str, exc: BaseException | None = None) -> float:
        """One operation failed because the service is unreachable: the delay before the next try.

        Only the first failure of an outage is logged as a warning, naming the exception's type
        and message; its traceback goes to DEBUG (once per outage: the warning stays one line);
        the rest of the outage's failures are logged at DEBUG. Just after a recovery the warning
        waits ``BLIP_S`` (see ``SAME_OUTAGE_S``) and then names that first failure."""
        now = self._clock()
        self.last_seen = now
        if self.down_since is None:
            self.down_since = now
            if now - self._recovered_at < SAME_OUTAGE_S:
                self._blip = (what, exc)
                self._log.debug("%s failed %.1fs after it came back (%s: %s): a blip unless it goes on",
                                self.service, now - self._recovered_at, what, self._cause(exc))
            else:
                self._report(what, exc)
        elif self._blip is not None and now - self.down_since >= BLIP_S:
            first_what, first_exc = self._blip
            self._report(first_what, first_exc)
        else:
            self._log.debug("%s still unavailable (%s: %s)", self.service, what, self._cause(exc))
        delay, self._next_s = self._next_s, min(self._next_s * 2, self._max_s)
        return delay

    @staticmethod
    def _cause(exc: BaseException | None) -> str:
        return describe(exc) if exc is not None else "unreachable"

    def _report(self, what: str, exc: BaseException | None) -> None:
        """The outage's one warning (and its first failure's traceback at DEBUG)."""
        self._blip = None
        self.outages += 1
        cause = self._cause(exc)
        if self.loop is None:
            self._log.warning("%s unavailable (%s: %s); retrying with backoff until it is back",
                              self.service, what, cause)
        else:
            at = f" at {self.setting}" if self.setting else ""
            self._log.warning("%s unavailable%s (%s); %s retries with backoff up to %.0fs",
                              self.service, at, cause, self.loop, self._max_s)
        if exc is not None:
            self._log.debug("%s outage: the first failure's traceback", self.service, exc_info=exc)

    def ok(self) -> None:
        """An operation succeeded: if the service was down, log once that it is back; reset the backoff."""
        self._next_s = self._initial_s
        if self.down_since is not None:
            now = self._clock()
            if self._blip is not None:
                self._log.debug("%s answers again after %.1fs: a blip", self.service, now - self.down_since)
            elif self.loop is None:
                self._log.warning("%s available again after %.1fs", self.service, now - self.down_since)
            else:
                self._log.info("%s available again; %s resumed", self.service, self.loop)
            self._blip, self._recovered_at = None, now
            self.down_since = None
            self.last_seen = now

    def recently(self, window_s: float) -> bool:
        """True while the service is down, or was within the last ``window_s`` seconds.

        A waiter that lived through an outage gives a task that could not renew its lease
        meanwhile a little more grace before it calls it lost."""
        return self.down or self._clock() - self.last_seen < window_s
