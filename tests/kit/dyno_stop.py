"""How a dyno manager stops a process, and the bounds a stopped fleet process must meet.

Heroku sends SIGTERM to every process of a dyno and SIGKILL 30 s later
(reference/ecosystem.md §5), so a test signals the whole process group.
"""

from __future__ import annotations

import signal
import subprocess
import time

from devstack.infra.procs import signal_group
from tasks.settings import WORKER_SOFT_SHUTDOWN_TIMEOUT_S

HEROKU_KILL_AFTER_S = 30.0  # SIGTERM → SIGKILL on Heroku
WORKER_EXIT_GRACE_S = 25.0  # below HEROKU_KILL_AFTER_S: we SIGKILL only if this is exceeded
PROCFILE_SOFT_WINDOW_S = WORKER_SOFT_SHUTDOWN_TIMEOUT_S  # the window the Procfile's workers run with
# A stopping worker exits this soon after its last task in hand ended. One that waited the window out
# would exit about 8 s after a job that ends in the window's first 2 s; a loaded 2-core box took 2.5 s
# to exit as it should, so the bound sits between the two. The log line is the causal proof.
QUICK_DRAIN_LIMIT_S = PROCFILE_SOFT_WINDOW_S / 2


def terminate(proc: subprocess.Popen[bytes], grace_s: float = WORKER_EXIT_GRACE_S) -> tuple[float, bool]:
    """SIGTERM the process group as the dyno manager does; SIGKILL if it outlives ``grace_s``.

    Returns (seconds until exit, whether SIGKILL was needed)."""
    started = time.monotonic()
    killed = signal_group(proc, signal.SIGTERM, grace_s)
    return time.monotonic() - started, killed
