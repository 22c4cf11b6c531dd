"""Waiting for state that has no event to await (prefer an event when there is one)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

DEFAULT_POLL_INTERVAL_S = 0.05

T = TypeVar("T")


def wait_until(predicate: Callable[[], T | None], timeout_s: float, what: str,
               interval_s: float = DEFAULT_POLL_INTERVAL_S) -> T:
    """Poll ``predicate`` until truthy and return its value. Only for state that has no event to await."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
