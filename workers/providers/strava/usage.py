"""Strava's rate-limit headers and the real reset times of its windows."""

from __future__ import annotations

import email.utils
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

from workers.providers.errors import ProviderRateLimited
from workers.providers.windows import RateWindow, WindowUsage

SHORT_WINDOW = "short"
DAILY_WINDOW = "daily"
WEBHOOK_WINDOW = "webhook"
SHORT_WINDOW_S = 15 * 60
DAILY_WINDOW_S = 24 * 3600
WEBHOOK_WINDOW_S = 15 * 60
# Until a response reports the app's real limits: Strava's default read budget per app.
SHORT_FALLBACK_CAPACITY = 100
DAILY_FALLBACK_CAPACITY = 1000
WEBHOOK_FALLBACK_CAPACITY = 20  # webhook-triggered fetches spend a small 15-min window of their own
# The windows the shared limiter keeps per Strava app (``strava.<app_id>.<window>``).
RATE_WINDOWS = (
    RateWindow(SHORT_WINDOW, SHORT_FALLBACK_CAPACITY, SHORT_WINDOW_S, snapshot_as="short"),
    RateWindow(DAILY_WINDOW, DAILY_FALLBACK_CAPACITY, DAILY_WINDOW_S, snapshot_as="long"),
    RateWindow(WEBHOOK_WINDOW, WEBHOOK_FALLBACK_CAPACITY, WEBHOOK_WINDOW_S),
)
RESET_GRACE_S = 5.0  # wait a little past the boundary: our clock and Strava's differ

READ_LIMIT_HEADER = "X-ReadRateLimit-Limit"
READ_USAGE_HEADER = "X-ReadRateLimit-Usage"
LIMIT_HEADER = "X-RateLimit-Limit"
USAGE_HEADER = "X-RateLimit-Usage"


def next_short_reset(now: datetime) -> datetime:
    """The next quarter-hour boundary strictly after ``now`` (UTC).

    Strava reports limit and usage but never a reset; its windows are fixed on the clock
    (reference §4.7), and anchoring a NAK to the boundary is what the contract asks.
    """
    now = now.astimezone(UTC)
    floor = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    return floor + timedelta(seconds=SHORT_WINDOW_S)


def next_daily_reset(now: datetime) -> datetime:
    """The next midnight UTC strictly after ``now``."""
    now = now.astimezone(UTC)
    return now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)


def _pair(value: str | None) -> tuple[int, int] | None:
    """Parse ``"<15-min>,<daily>"``; None when missing or malformed."""
    if not value:
        return None
    parts = value.split(",")
    if len(parts) != 2:
        return None
    try:
        return int(parts[0].strip()), int(parts[1].strip())
    except ValueError:
        return None


def parse_usage(headers: Mapping[str, str], now: datetime | None = None) -> list[WindowUsage]:
    """The short and daily windows reported on a response; empty when none are.

    ``headers`` may be an ``httpx.Headers`` (case-insensitive) or a plain dict. The read budget
    (``X-ReadRateLimit-*``), which every call we make spends, is preferred; the overall headers
    are the fallback when a read header is missing or malformed.
    A window whose limit is not positive is skipped (nothing to sync).
    """
    now = now or datetime.now(UTC)
    get = _getter(headers)
    limits, usage = _pair(get(READ_LIMIT_HEADER)), _pair(get(READ_USAGE_HEADER))
    if limits is None or usage is None:
        limits, usage = _pair(get(LIMIT_HEADER)), _pair(get(USAGE_HEADER))
    if limits is None or usage is None:
        return []
    windows = []
    if limits[0] > 0:
        windows.append(WindowUsage(SHORT_WINDOW, limits[0], usage[0], next_short_reset(now)))
    if limits[1] > 0:
        windows.append(WindowUsage(DAILY_WINDOW, limits[1], usage[1], next_daily_reset(now)))
    return windows


def rate_limited_from_429(headers: Mapping[str, str], now: datetime | None = None) -> ProviderRateLimited:
    """Which window a 429 exhausted and when it really resets.

    Daily usage at or above its limit means the daily window (wait for
    midnight UTC); otherwise the 15-minute window. A ``Retry-After`` header is
    Strava's own word and wins over our computation.
    """
    now = now or datetime.now(UTC)
    windows = {w.window: w for w in parse_usage(headers, now)}
    daily = windows.get(DAILY_WINDOW)
    if daily is not None and daily.used >= daily.limit:
        window, reset_at = DAILY_WINDOW, daily.reset_at
    else:
        window, reset_at = SHORT_WINDOW, next_short_reset(now)
    retry_after = _retry_after(_getter(headers)("Retry-After"), now)
    if retry_after is not None:
        reset_at = retry_after
    return ProviderRateLimited(reset_at, window, grace_s=RESET_GRACE_S)


def _retry_after(value: str | None, now: datetime) -> datetime | None:
    """``Retry-After`` as delta seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return now + timedelta(seconds=int(value))
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def _getter(headers: Mapping[str, str]) -> Callable[[str], str | None]:
    """Case-insensitive header lookup for plain dicts as well as ``httpx.Headers``."""
    lowered = {str(k).lower(): v for k, v in headers.items()}
    return lambda name: lowered.get(name.lower())
