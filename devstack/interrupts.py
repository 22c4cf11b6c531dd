"""Ctrl-C for the commands that hold a stack up: stop it once, in order, whatever the shell did to SIGINT."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

CTRL_C_POLL_S = 1.0  # how often a main thread waiting for Ctrl-C wakes to run a handler another thread took


def wait_for_ctrl_c() -> None:
    """Block until Ctrl-C (or a SIGTERM made one) raises ``KeyboardInterrupt`` here.

    Not ``signal.pause()``: this process has threads (the in-process fakes), and the kernel may
    hand the signal to one of them; CPython then runs its handler only when the main thread next
    runs bytecode, which a main thread blocked in ``pause()`` never does."""
    while True:
        time.sleep(CTRL_C_POLL_S)


def stop_on_ctrl_c() -> None:
    """Ctrl-C, and a SIGTERM made one, raise ``KeyboardInterrupt`` in this process, whatever it inherited.

    A command started in the background of a non-interactive shell (a script's ``make stack &``, a CI
    job, ``nohup``) inherits SIGINT ignored, and Python then installs no handler of its own: Ctrl-C and
    ``kill -INT`` did nothing, and only SIGKILL ended it, leaving its servers and its ``.env`` behind."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)


@contextmanager
def signals_ignored() -> Iterator[None]:
    """While the stack stops, a second Ctrl-C must not abort it half-way and leave servers behind."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
