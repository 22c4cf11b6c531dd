"""Child processes of the dev stack, the tests and the benchmarks: started in a session, stopped as a group.

Every fleet process we start (``python -m bridges ...``, ``celery -A tasks worker``,
``celery beat``, honcho, moto) runs in its own session, so its process group
holds its pool children too. Stopping it means what the Heroku dyno manager
does (reference/ecosystem.md §5): a signal to the whole group, a grace period,
then SIGKILL to the group. One implementation here, so every test, the demo and
the benchmarks stop processes the same way.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STOP_TIMEOUT_S = 15.0  # grace between the stop signal and SIGKILL, unless a caller says otherwise


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
