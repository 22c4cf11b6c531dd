"""Where a socket left open was made: the test, thread and stack, named in the failure it causes."""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

STACK_FRAMES = 20  # enough to climb from socket.create_connection through a client library to the test
RUNNER_PATHS = ("/_pytest/", "/pluggy/")  # pytest's own frames: the climb stops at the first of them
MAX_ORIGINS = 50_000  # entries kept (keyed by id, so a dead socket's entry goes when its id is reused)

Frame = tuple[str, int, str]
Origin = tuple[str, str, tuple[Frame, ...]]  # test, thread, frames (innermost first)

_origins: dict[int, Origin] = {}
_real_init = socket.socket.__init__


def _frames(frame: FrameType | None) -> tuple[Frame, ...]:
    found: list[Frame] = []
    while frame is not None and len(found) < STACK_FRAMES:
        if any(part in frame.f_code.co_filename for part in RUNNER_PATHS):
            break
        found.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return tuple(found)


def _recording_init(self: socket.socket, *args: Any, **kwargs: Any) -> None:
    """``socket.socket.__init__``, noting the test running (``PYTEST_CURRENT_TEST``), the thread and the frames.

    A socket dropped inside a reference cycle warns only when the collector frees the cycle, which
    fails whichever test the xdist worker runs then (docs/TESTING.md); ``PYTHONTRACEMALLOC`` would say
    where it was made at a cost no run pays. This costs a few microseconds a socket, so it is always on.
    """
    _real_init(self, *args, **kwargs)
    if len(_origins) >= MAX_ORIGINS:
        _origins.clear()
    _origins[id(self)] = (os.environ.get("PYTEST_CURRENT_TEST", "(no test running)"),
                          threading.current_thread().name, _frames(sys._getframe(1)))


def origin_of(sock: socket.socket) -> str | None:
    """Where ``sock`` was made, as lines to read, or None if this plugin did not see it made."""
    found = _origins.get(id(sock))
    if found is None:
        return None
    test, thread, frames = found
    lines = [f"socket made during {test} on thread {thread!r}, at:"]
    lines += [f"  {path}:{line} in {name}" for path, line, name in frames]
    return "\n".join(lines)


def naming(previous: Callable[[Any], object]) -> Callable[[Any], None]:
    """An unraisable hook that adds a socket's origin to its ``ResourceWarning``, then calls ``previous``."""
    def hook(unraisable: Any) -> None:
        obj, exc = unraisable.object, unraisable.exc_value
        if isinstance(obj, socket.socket) and isinstance(exc, ResourceWarning):
            origin = origin_of(obj)
            if origin is not None and len(exc.args) == 1:
                exc.args = (f"{exc.args[0]}\n{origin}",)
        previous(unraisable)
    return hook


@pytest.hookimpl(trylast=True)  # after pytest's own unraisable hook is in place, so this one wraps it
def pytest_configure(config: pytest.Config) -> None:
    socket.socket.__init__ = _recording_init  # type: ignore[method-assign]
    sys.unraisablehook = naming(sys.unraisablehook)


def pytest_unconfigure(config: pytest.Config) -> None:
    socket.socket.__init__ = _real_init  # type: ignore[method-assign]
