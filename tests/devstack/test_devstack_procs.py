"""devstack/infra/procs: freezing a process means every thread of it, not the signal being pending.

The chaos tests freeze nats-server and Redis (SIGSTOP) to stand for a server that is connected and
silent. If a thread of the frozen process could still run, a request the test sends next could be
answered, and the test would see a healthy server where it meant a silent one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from devstack.infra.procs import STOPPED_STATES, freeze, frozen, thread_states

THREADS = 8  # busy threads in the child: more than the box's cores, so some wait to run when it is stopped
TICK_WAIT_S = 10.0  # how long the child may take to start counting
QUIET_S = 0.2  # how long a frozen child is watched for a tick

COUNTER = f"""
import os, threading
started = threading.Barrier({THREADS} + 1)
def spin():
    started.wait()
    while True:
        os.write(1, b".")
for _ in range({THREADS}):
    threading.Thread(target=spin, daemon=True).start()
started.wait()
os.write(1, b"!")
threading.Event().wait()
"""


def _ticking_child() -> subprocess.Popen[bytes]:
    child = subprocess.Popen([sys.executable, "-c", COUNTER], stdout=subprocess.PIPE)
    assert child.stdout is not None
    while child.stdout.read(1) != b"!":  # every thread runs
        pass
    return child


def _drain(child: subprocess.Popen[bytes]) -> int:
    """How many ticks are waiting in the pipe (read without blocking)."""
    assert child.stdout is not None
    os.set_blocking(child.stdout.fileno(), False)
    total = 0
    while chunk := child.stdout.read(1 << 16):
        total += len(chunk)
    return total


def test_a_frozen_process_has_every_thread_stopped_and_runs_no_more() -> None:
    child = _ticking_child()
    try:
        with frozen(child.pid):
            assert set(thread_states(child.pid)) <= STOPPED_STATES
            assert len(thread_states(child.pid)) == THREADS + 1
            _drain(child)  # what was written before every thread stopped
            time.sleep(QUIET_S)  # watching for something that must not happen: there is no event to await
            assert _drain(child) == 0
        deadline = time.monotonic() + TICK_WAIT_S
        while _drain(child) == 0:  # continued: it counts again
            assert time.monotonic() < deadline, "the child did not run again after SIGCONT"
            time.sleep(0.01)
    finally:
        child.kill()
        child.communicate()  # waits, and closes its pipe


def test_freeze_leaves_a_process_stopped_for_the_caller_to_kill() -> None:
    child = _ticking_child()
    try:
        freeze(child.pid)
        assert set(thread_states(child.pid)) <= STOPPED_STATES
    finally:
        child.kill()
        child.communicate()  # waits, and closes its pipe
