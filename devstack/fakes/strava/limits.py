"""The fake Strava's rate limits: per-app usage windows, usage headers and the 429 decision.

Strava meters each application (not each athlete) on two windows at once, a
15-minute one aligned to :00/:15/:30/:45 and a daily one reset at 00:00 UTC,
with an overall budget and a tighter read (GET) budget on each (reference
``cairn.md`` §4). Every API answer carries the four ``X-*RateLimit-*``
headers, and the provider pool's limiter steers by them, so the fake has to
count and report them exactly like Strava does: a request over budget is
refused *without* being counted, and a 429 forced by a test reports the spent
window as full. Kept apart from the HTTP routes (``devstack.fakes.strava.api``) so
the bookkeeping can be read, and checked against Strava's documentation, on its
own.

Not thread-safe by itself: ``FakeStrava`` holds its lock around every call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

SHORT_WINDOW_S = 15 * 60  # Strava's short window: 15 minutes, aligned to the quarter hour
DAY_S = 24 * 3600  # Strava's daily window, reset at 00:00 UTC
DEFAULT_LIMITS = (200, 2000)  # overall requests per application (15-min, daily)
DEFAULT_READ_LIMITS = (100, 1000)  # read (GET) requests per application (15-min, daily)
WINDOWS = ("short", "daily")  # what ``force_429`` can pretend is spent


@dataclass
class Usage:
    """One application's counters, and which windows (by index since the epoch) they count."""

    short_window: int = -1
    day: int = -1
    short: int = 0
    daily: int = 0
    read_short: int = 0
    read_daily: int = 0


@dataclass(frozen=True)
class Verdict:
    """Whether a request may go on, and the usage headers its answer carries either way."""

    allowed: bool
    headers: dict[str, str]


class RateBudget:
    """Per-application usage on Strava's two windows, with test hooks to force or preset it.

    ``clock`` is read once per window lookup, so a test's settable clock moves
    requests across window boundaries without waiting.
    """

    def __init__(self, limits: tuple[int, int], read_limits: tuple[int, int],
                 clock: Callable[[], float]) -> None:
        self.limits, self.read_limits = limits, read_limits
        self._clock = clock
        self._usage: dict[str, Usage] = {}
        self._forced_429: list[tuple[str, float | None]] = []

    def current(self, client_id: str) -> Usage:
        """The app's counters, zeroed first for whichever window has rolled over since the last call."""
        now = self._clock()
        usage = self._usage.setdefault(client_id, Usage())
        if usage.short_window != int(now // SHORT_WINDOW_S):
            usage.short_window, usage.short, usage.read_short = int(now // SHORT_WINDOW_S), 0, 0
        if usage.day != int(now // DAY_S):
            usage.day, usage.daily, usage.read_daily = int(now // DAY_S), 0, 0
        return usage

    def headers(self, usage: Usage, forced: str | None = None) -> dict[str, str]:
        """Strava's four usage headers; a ``forced`` window reports at least its limit, as if spent."""
        short, daily, rshort, rdaily = usage.short, usage.daily, usage.read_short, usage.read_daily
        if forced == "short":
            short, rshort = max(short, self.limits[0]), max(rshort, self.read_limits[0])
        elif forced == "daily":
            daily, rdaily = max(daily, self.limits[1]), max(rdaily, self.read_limits[1])
        return {"X-RateLimit-Limit": f"{self.limits[0]},{self.limits[1]}",
                "X-RateLimit-Usage": f"{short},{daily}",
                "X-ReadRateLimit-Limit": f"{self.read_limits[0]},{self.read_limits[1]}",
                "X-ReadRateLimit-Usage": f"{rshort},{rdaily}"}

    def admit(self, client_id: str, is_read: bool) -> Verdict:
        """Forced 429 first, then the budget check, then count the request: Strava's order.

        A refused request is not counted (Strava does not charge a 429), and the
        read budget applies to reads only.
        """
        usage = self.current(client_id)
        if self._forced_429:
            window, retry_after = self._forced_429.pop(0)
            headers = self.headers(usage, window)
            if retry_after is not None:
                headers["Retry-After"] = str(int(math.ceil(retry_after)))
            return Verdict(False, headers)
        over = (usage.short >= self.limits[0] or usage.daily >= self.limits[1]
                or (is_read and (usage.read_short >= self.read_limits[0]
                                 or usage.read_daily >= self.read_limits[1])))
        if over:
            return Verdict(False, self.headers(usage))
        usage.short, usage.daily = usage.short + 1, usage.daily + 1
        if is_read:
            usage.read_short, usage.read_daily = usage.read_short + 1, usage.read_daily + 1
        return Verdict(True, self.headers(usage))

    def force_429(self, times: int, window: str, retry_after_s: float | None) -> None:
        """Queue ``times`` refusals that report ``window`` (one of ``WINDOWS``) as spent."""
        if window not in WINDOWS:
            raise ValueError("window must be 'short' or 'daily'")
        self._forced_429.extend([(window, retry_after_s)] * times)

    def set_usage(self, client_id: str, short: int, daily: int, read_short: int | None,
                  read_daily: int | None) -> None:
        """Preset the current windows' counters (reads default to the overall counts)."""
        usage = self.current(client_id)
        usage.short, usage.daily = short, daily
        usage.read_short = short if read_short is None else read_short
        usage.read_daily = daily if read_daily is None else read_daily

    def snapshot(self, client_id: str) -> dict[str, int]:
        """The current windows' counters, as plain numbers for assertions."""
        u = self.current(client_id)
        return {"short": u.short, "daily": u.daily, "read_short": u.read_short, "read_daily": u.read_daily}
