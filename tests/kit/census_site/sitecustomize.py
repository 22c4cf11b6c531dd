"""Census hook: with ``SWITCHYARD_CENSUS`` set, each Python process appends its CPU to that file at exit."""

from __future__ import annotations

import atexit
import os
import resource
import sys
import time

CENSUS_FILE = os.environ.get("SWITCHYARD_CENSUS")
ARGV_CHARS = 300  # enough of a command line to tell one fleet process from another
_started = time.monotonic()


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def record() -> None:
    """One line per process that exits through Python (SIGKILL and ``os._exit`` leave none: a prefork
    child's CPU is counted in its parent's children column instead)."""
    module = os.environ.get("PYTEST_CURRENT_TEST", "-").split("::", 1)[0]  # inherited from the test that started it
    line = (f"{os.getpid()}\t{_cpu(resource.RUSAGE_SELF):.3f}\t{_cpu(resource.RUSAGE_CHILDREN):.3f}\t"
            f"{time.monotonic() - _started:.1f}\t{module}\t{' '.join(sys.argv)[:ARGV_CHARS]}\n")
    try:
        with open(CENSUS_FILE, "a") as out:  # type: ignore[arg-type]  # registered only when it is set
            out.write(line)  # one short append: lines of concurrent processes do not interleave
    except OSError:
        pass


if CENSUS_FILE:
    atexit.register(record)
