"""Run one fleet process from a given tree and say where its code came from (``release_probe.py <root> <module>``)."""

from __future__ import annotations

import atexit
import importlib.util
import os
import runpy
import sys

PACKAGES = ("tasks", "workers", "bridges", "ops", "deploy", "devstack")  # import roots, this tree's and older
PROBE = "release-probe"  # the prefix of every line this wrapper prints
OUT = sys.__stdout__  # the real stdout: a Celery worker logs what is printed to its redirected one as a WARNING


def _foreign_modules(root: str) -> list[str]:
    """Loaded project modules whose file is not under ``root``."""
    foreign = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name.split(".")[0] in PACKAGES and path and not os.path.realpath(path).startswith(root + os.sep):
            foreign.append(f"{name} ({path})")
    return sorted(foreign)


def _report_at_exit(root: str, pid: int) -> None:
    if os.getpid() != pid:  # a forked pool child ends through os._exit; only the main process reports
        return
    foreign = _foreign_modules(root)
    loaded = sum(1 for name in sys.modules if name.split(".")[0] in PACKAGES)
    if foreign:
        print(f"{PROBE}: pid {pid} loaded modules of another tree: {', '.join(foreign)}", file=OUT, flush=True)
    else:
        print(f"{PROBE}: pid {pid} loaded {loaded} project modules, all from {root}", file=OUT, flush=True)


def main() -> None:
    """Put ``<root>`` first on ``sys.path``, say where the packages resolve, run ``<module>`` as ``-m`` would.

    Why: the project is installed editable in the test's virtualenv, so a process of the previous
    release (its tree checked out elsewhere) could load this release's modules without anyone
    noticing; the editable finder only answers what ``sys.path`` does not. At exit the main process
    prints any project module it loaded from another tree. Not imported by anything: run by path.
    """
    root, module = os.path.realpath(sys.argv[1]), sys.argv[2]
    sys.path[0] = root  # this script's own directory would be first otherwise
    origins = {name: getattr(importlib.util.find_spec(name), "origin", None) for name in PACKAGES[:3]}
    print(f"{PROBE}: pid {os.getpid()} runs {module} from {root}: "
          + ", ".join(f"{name}={origin}" for name, origin in origins.items()), flush=True)
    atexit.register(_report_at_exit, root, os.getpid())
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
