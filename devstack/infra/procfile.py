"""Run the Procfile's processes as Heroku's dyno manager does, for the demo.

Each entry runs as ``bash -c <command>`` in a session of its own (bash execs
a lone simple command, so the process we hold is the process itself), its
output in ``<log_dir>/<type>.log``. Stopping sends SIGTERM to every process
group at once and SIGKILL only after ``STOP_GRACE_S``, the 30 s Heroku gives
(reference/ecosystem.md §5).

Why not honcho, the local runner of docs/operations.md: honcho SIGKILLs
whatever still runs 5 s after its SIGTERM (``honcho.manager.KILL_WAIT``, not
configurable), shorter than the fleet's own shutdown: a Celery worker with a
running task waits its 10 s soft-shutdown window before it hands the job
back, and Flower waits for its in-flight inspect calls (about 8 s). Under
honcho those processes are killed mid-shutdown.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from devstack.infra.nats_auth import Pool
from devstack.infra.procs import Proc, spawn
from workers.cairn.settings import CairnSettings
from workers.providers.registry import provider_names

ROOT = Path(__file__).resolve().parents[2]
PROCFILE = ROOT / "Procfile"
STOP_GRACE_S = 30.0  # Heroku: SIGTERM to every process, SIGKILL 30 s later
SHELL = shutil.which("bash") or "/bin/sh"
_LINE = re.compile(r"^([A-Za-z0-9_-]+):\s*(.+)$")  # honcho's own pattern
_INLINE_PROVIDER = re.compile(r"(?:^|\s)CAIRN_PROVIDER=([a-z0-9_-]+)\s")  # a pool's line names its provider
_INLINE_POOL = re.compile(r"(?:^|\s)CAIRN_WORKER_NAME=([A-Za-z0-9_-]+)\s")  # ... and its pool
_CAIRN_BRIDGE = re.compile(r"(?:^|\s)python -m bridges cairn(?:\s|$)")  # one bridge line per pool
_CONCURRENCY = re.compile(r"\s-c \$\{([A-Z_]+):-(\d+)\}")  # a worker line's ``-c ${IO_CONCURRENCY:-4}``


def entries(path: Path = PROCFILE) -> dict[str, str]:
    """Process type -> command, in the Procfile's order."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = _LINE.match(line.strip())
        if match:
            found[match.group(1)] = match.group(2)
    return found


def provider_of(command: str) -> str | None:
    """The provider a Procfile line sets for its own pool (``CAIRN_PROVIDER=garmin …``), else None."""
    match = _INLINE_PROVIDER.search(command)
    return match.group(1) if match else None


def pool_of(command: str) -> str | None:
    """The pool a Procfile line names for itself (``CAIRN_WORKER_NAME=garmin-fetcher …``), else None."""
    match = _INLINE_POOL.search(command)
    return match.group(1) if match else None


def pools(found: dict[str, str]) -> list[Pool]:
    """The Cairn pools the Procfile runs, in its order: one per bridge line, named by the line or,
    where it names nothing, by the settings' defaults (the deployment's own ``CAIRN_*``)."""
    provider, name = (str(CairnSettings.model_fields[f].default) for f in ("provider", "worker_name"))
    return [Pool(provider_of(cmd) or provider, pool_of(cmd) or name) for cmd in found.values()
            if _CAIRN_BRIDGE.search(cmd)]


def concurrency(found: dict[str, str]) -> dict[str, int]:
    """Every worker line's concurrency variable and the default its line gives it (``IO_CONCURRENCY: 4``)."""
    return {m[1]: int(m[2]) for cmd in found.values() for m in _CONCURRENCY.finditer(cmd)}


def runnable(found: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the entries this installation can run, those it cannot: type -> the missing provider).

    A pool's line whose provider is not installed (no built-in, no entry point) would only exit
    at start naming ``CAIRN_PROVIDER``; the dev runners leave it out and say so instead.
    """
    installed = set(provider_names())
    missing = {name: p for name, cmd in found.items() if (p := provider_of(cmd)) is not None and p not in installed}
    return {name: cmd for name, cmd in found.items() if name not in missing}, missing


@dataclass
class Fleet:
    """The running processes, by type."""

    procs: dict[str, Proc]
    log_dir: Path
    killed: list[str] = field(default_factory=list)

    def exited(self) -> list[str]:
        """Types whose process has exited (a fleet process never should while the demo runs)."""
        return [name for name, p in self.procs.items() if p.proc.poll() is not None]

    def stop(self, grace_s: float = STOP_GRACE_S) -> list[str]:
        """SIGTERM to every process group at once, SIGKILL to those still up after ``grace_s``.

        Returns the types that had to be killed (also kept in ``killed``).
        """
        for p in self.procs.values():
            if p.proc.poll() is None:
                os.killpg(p.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for name, p in self.procs.items():
            try:
                p.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.proc.pid, signal.SIGKILL)
                p.proc.wait()
                self.killed.append(name)
        return self.killed


def run(name: str, env: dict[str, str], log_path: Path, path: Path = PROCFILE) -> Proc:
    """One process of the Procfile's type ``name``, as Heroku runs it (``bash -c`` in a session of its
    own), its output in ``log_path``; stopped like a dyno (SIGTERM, SIGKILL after ``STOP_GRACE_S``)."""
    return spawn([SHELL, "-c", entries(path)[name]], env, log_path, stop_timeout_s=STOP_GRACE_S)


def start(env: dict[str, str], log_dir: Path, port: int, path: Path = PROCFILE) -> Fleet:
    """Start one process of every runnable type in ``path`` (:func:`runnable`); ``PORT`` is ``port``
    (only ``web`` listens)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    # The node name comes from HONCHO_PROCESS_NAME, as on one box under honcho: DYNO would say "Heroku",
    # where dynos share no disk and the Voicy side refuses the local media store this one-box fleet uses.
    procs = {name: run(name, {**env, "PORT": str(port), "HONCHO_PROCESS_NAME": f"{name}.1"}, log_dir / f"{name}.log",
                       path)
             for name in runnable(entries(path))[0]}
    return Fleet(procs, log_dir)
