"""Rate-limit windows: what a provider declares, what it observes, and how it spends them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

SnapshotSlot = Literal["short", "long"]


@dataclasses.dataclass(frozen=True)
class RateWindow:
    """One budget window of a provider app, as the shared limiter needs to know it.

    Only the provider knows its API's budgets; the limiter (``workers/cairn/ratelimit.py``)
    learns each window from these specs, spends through :class:`RateLimitHook` and syncs the
    real numbers from :class:`WindowUsage`.

    ``capacity`` is the budget the limiter opens a window with before the
    provider has reported its real limit on a response (0: unlimited, never
    denied). ``length_s`` is how long a window the limiter opens itself lasts;
    a window the provider reported ends at the reported reset instead.
    ``snapshot_as`` places the window in a ``RateLimitSnapshot`` (its
    ``short*`` or ``long*`` fields), or nowhere.
    """

    name: str
    capacity: int
    length_s: float
    snapshot_as: SnapshotSlot | None = None

    def __post_init__(self) -> None:
        if not self.name or "." in self.name or ":" in self.name:
            raise ValueError(f"rate window name {self.name!r} must be one KV key token")
        if self.capacity < 0 or self.length_s <= 0:
            raise ValueError(f"rate window {self.name!r}: capacity >= 0 and length_s > 0")


@dataclasses.dataclass(frozen=True)
class WindowUsage:
    """One provider rate-limit window as the provider reported it on a response."""

    window: str
    limit: int
    used: int
    reset_at: datetime

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)


@runtime_checkable
class RateLimitHook(Protocol):
    """The bridge to the shared budget (``cairn_rate_limits`` KV) without knowing NATS.

    ``reserve`` is called before every API request with the windows the call
    spends (e.g. ``("daily", "short")``) and raises ``ProviderRateLimited``
    when one is exhausted. ``observe`` is called after every response,
    including errors and 429s, with the usage the provider reported.
    """

    def reserve(self, windows: Sequence[str]) -> None: ...

    def observe(self, usage: Sequence[WindowUsage], headers: Mapping[str, str]) -> None: ...


class NullRateLimitHook:
    """No shared budget: every reservation succeeds, observations are dropped."""

    def reserve(self, windows: Sequence[str]) -> None:
        return None

    def observe(self, usage: Sequence[WindowUsage], headers: Mapping[str, str]) -> None:
        return None
