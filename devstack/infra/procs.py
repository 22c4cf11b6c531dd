"""Child processes of the dev stack, the tests and the benchmarks: started in a session, stopped as a group.

Every fleet process we start (``python -m bridges ...``, ``celery -A tasks worker``,
``celery beat``, honcho, moto) runs in its own session, so its process group
holds its pool children too. Stopping it means what the Heroku dyno manager
does (reference/ecosystem.md §5): a signal to the whole group, a grace period,
then SIGKILL to the group. One implementation here, so every test, the demo and
the benchmarks stop processes the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STOP_TIMEOUT_S = 15.0  # grace between the stop signal and SIGKILL, unless a caller says otherwise
FREEZE_TIMEOUT_S = 10.0  # how long every thread of a SIGSTOPped process may take to stop (a loaded box)
FREEZE_POLL_S = 0.001  # between reads of the threads' states while they stop
STOPPED_STATES = frozenset("Tt")  # /proc/<pid>/task/<tid>/stat: group-stopped, or stopped by a tracer


def signal_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM,
                 grace_s: float = STOP_TIMEOUT_S) -> bool:
    """Send ``sig`` to the process group of ``proc``; SIGKILL the group if it outlives ``grace_s``.

    The group, not the pid: a Celery prefork parent alone would leave its children
    running. Signals unconditionally (a caller that may hold an exited process
    uses ``stop_group``). Returns whether SIGKILL was needed.
    """
    os.killpg(proc.pid, sig)
    try:
        proc.wait(grace_s)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return True


def stop_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM,
               grace_s: float = STOP_TIMEOUT_S) -> int | None:
    """``signal_group`` if the process still runs (stopping twice is harmless); its exit code."""
    if proc.poll() is None:
        signal_group(proc, sig, grace_s)
    return proc.returncode


def thread_states(pid: int) -> list[str]:
    """The scheduler state of every thread of ``pid`` (``R``, ``S``, ``T``...), from ``/proc``."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(FileNotFoundError):  # a thread that exited meanwhile
            states.append(stat.read_text().rpartition(")")[2].split()[0])  # the name may hold spaces
    return states


def freeze(pid: int) -> None:
    """Stop ``pid`` (SIGSTOP) and return once every thread of it has stopped.

    Why wait after the signal: ``kill`` returns once SIGSTOP is pending, and Linux wakes one
    thread to begin the group stop, which then stops the others. Until that thread is
    scheduled, the others run on. On a loaded box a frozen nats-server answered a KV call
    sent right after ``kill`` (test_cairn_publish_retry, test_cairn_ratelimit, a 1-in-6 flake).
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + FREEZE_TIMEOUT_S
    while not all(state in STOPPED_STATES for state in thread_states(pid)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} still has running threads {FREEZE_TIMEOUT_S}s after SIGSTOP")
        time.sleep(FREEZE_POLL_S)


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[None]:
    """``pid`` frozen (:func:`freeze`) for the block, then continued (SIGCONT), however the block ends."""
    try:
        freeze(pid)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@dataclass
class Proc:
    """A long-running child process in its own session, its output appended to ``log_path``."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    stop_timeout_s: float = STOP_TIMEOUT_S

    @property
    def name(self) -> str:
        """What the process is, for reports: its log file's name without the suffix."""
        return self.log_path.stem

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float | None = None) -> int:
        """Signal the group, SIGKILL it after ``timeout_s`` (default ``stop_timeout_s``); the exit code."""
        stop_group(self.proc, sig, self.stop_timeout_s if timeout_s is None else timeout_s)
        return self.proc.returncode


def spawn(args: list[str], env: dict[str, str], log_path: Path, *,
          stop_timeout_s: float = STOP_TIMEOUT_S) -> Proc:
    """Start ``args`` from the repository root in a new session, stdout and stderr into ``log_path``.

    The log is opened for append (a restarted process of the same name keeps the
    earlier lines) and closed here at once: the child holds its own descriptor.
    """
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return Proc(proc, log_path, stop_timeout_s)
