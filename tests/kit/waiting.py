"""Waiting for state that has no event to await (prefer an event when there is one)."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TypeVar

DEFAULT_POLL_INTERVAL_S = 0.05
THREAD_FRAMES = 8  # the innermost frames of each other thread, noted on a timeout

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
    error = AssertionError(f"timed out after {timeout_s}s waiting for {what}")
    error.add_note(threads_now())
    raise error


def threads_now() -> str:
    """Where every other thread of this process stands: the fakes serve from threads of the test's
    process, so a wait that times out on a stalled fake shows the frame that holds it."""
    frames = sys._current_frames()
    lines = ["the other threads of this process at the timeout, innermost frames last:"]
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        if thread is threading.current_thread() or frame is None:
            continue
        lines.append(f"thread {thread.name!r}:")
        lines += [line.rstrip("\n") for line in traceback.format_stack(frame)[-THREAD_FRAMES:]]
    return "\n".join(lines)
