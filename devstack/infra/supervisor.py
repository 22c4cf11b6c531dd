"""A small process supervisor for the Procfile fleet: restart whatever dies, as a platform would.

The chaos harness (``python -m bench chaos``) runs the Procfile's own command
lines, one dyno per ``(name, index)`` of a formation, and kills fleet
processes at random. A platform (Heroku's dyno manager, systemd, Kubernetes)
restarts a dyno whose main process exited, after tearing down whatever was
left in it; this does the same:

* each dyno runs ``bash -c <Procfile line>`` (bash execs a lone simple command, so the dyno's
  process is the command itself) in a session of its own, with
  ``HONCHO_PROCESS_NAME=<name>.<index>`` (the Procfile names Celery nodes after it; not
  ``DYNO``, which means Heroku, where a Voicy process refuses a local media store);
* a monitor thread polls every ``MONITOR_INTERVAL_S``; when a dyno's top process
  has exited, the rest of its process group (orphaned prefork children) is
  SIGKILLed and the dyno starts again after ``RESTART_DELAY_S``, doubling up
  to ``MAX_RESTART_DELAY_S`` while it keeps dying within ``STABLE_AFTER_S`` of
  a start (a crash loop), as platforms back off;
* every exit is recorded with its exit code and whether the harness had just
  SIGKILLed that dyno, so a process that *exited by itself* (a crash) is told
  apart from one the harness killed.

Every loop is bounded by the monitor's stop event; ``stop()`` SIGTERMs every
dyno's group and SIGKILLs what outlives the grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from devstack.infra.procfile import SHELL
from devstack.infra.procs import Proc, spawn

Placement = Callable[[str, list[str], dict[str, str]], tuple[list[str], dict[str, str]]]
MONITOR_INTERVAL_S = 0.2
RESTART_DELAY_S = 1.0
MAX_RESTART_DELAY_S = 10.0
STABLE_AFTER_S = 30.0  # a dyno up this long is healthy again: its restart delay resets
KILL_ATTRIBUTION_S = 5.0  # an exit this soon after the harness SIGKILLed the dyno is the harness's doing
STOP_GRACE_S = 20.0
LOG_TAIL_CHARS = 3000  # of each dyno's log in a failure message: the lines that explain it come last


@dataclass
class Exit:
    """One observed end of a dyno's main process."""

    dyno: str
    returncode: int | None
    at: float
    killed_by_harness: bool


@dataclass
class Dyno:
    """One running copy of a Procfile process type."""

    name: str  # e.g. "gpu.2"
    kind: str  # the Procfile name, e.g. "gpu"
    command: str
    log_path: Path
    proc: Proc | None = None
    started_at: float = 0.0
    starts: int = 0
    restart_at: float | None = None
    delay_s: float = RESTART_DELAY_S
    killed_at: float | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.proc.poll() is None

    def main_process(self) -> psutil.Process | None:
        """The dyno's main process: the shell's command itself (``sh -c`` may or may not exec it)."""
        if not self.alive:
            return None
        try:
            top = psutil.Process(self.proc.proc.pid)  # type: ignore[union-attr]
            if os.path.basename(top.exe()) in ("sh", "dash", "bash"):
                children = top.children()
                return children[0] if children else None
            return top
        except psutil.Error:
            return None

    def pool_children(self) -> list[psutil.Process]:
        """The main process's direct children (a prefork pool's workers; none for bridges and beat)."""
        main = self.main_process()
        try:
            return main.children() if main is not None else []
        except psutil.Error:
            return []


@dataclass
class Supervisor:
    """Runs a formation of Procfile process types and restarts each dyno whose main process exits."""

    procfile: dict[str, str]
    formation: dict[str, int]  # process type -> number of dynos
    env: dict[str, str]
    log_dir: Path
    # Where a dyno runs: (dyno name, argv, env) -> the argv and env that run it there (a host of
    # devstack/netsim/hosts.py); None runs every dyno on this machine.
    place: Placement | None = None
    dynos: list[Dyno] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Supervisor:
        for kind, count in self.formation.items():
            for index in range(1, count + 1):
                name = f"{kind}.{index}"
                self.dynos.append(Dyno(name, kind, self.procfile[kind], self.log_dir / f"{name}.log"))
        for dyno in self.dynos:
            self._launch(dyno)
        self._thread = threading.Thread(target=self._monitor, name="supervisor", daemon=True)
        self._thread.start()
        return self

    def _launch(self, dyno: Dyno) -> None:
        argv, env = [SHELL, "-c", dyno.command], self.env | {"HONCHO_PROCESS_NAME": dyno.name}
        if self.place is not None:
            argv, env = self.place(dyno.name, argv, env)
        dyno.proc = spawn(argv, env, dyno.log_path, stop_timeout_s=STOP_GRACE_S)
        dyno.started_at, dyno.restart_at, dyno.killed_at = time.monotonic(), None, None
        dyno.starts += 1

    def _monitor(self) -> None:
        while not self._stop.wait(MONITOR_INTERVAL_S):
            now = time.monotonic()
            with self._lock:
                for dyno in self.dynos:
                    try:
                        self._check(dyno, now)
                    except OSError:  # a spawn that failed (fd or process limits): try again next tick
                        continue

    def _check(self, dyno: Dyno, now: float) -> None:
        if dyno.proc is None:
            return
        if dyno.restart_at is not None:
            if now >= dyno.restart_at:
                self._launch(dyno)
            return
        rc = dyno.proc.proc.poll()
        if rc is None:
            if now - dyno.started_at >= STABLE_AFTER_S:
                dyno.delay_s = RESTART_DELAY_S
            return
        # The main process is gone: tear down what is left of the dyno (orphaned pool children).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(dyno.proc.proc.pid, signal.SIGKILL)
        killed = dyno.killed_at is not None and now - dyno.killed_at <= KILL_ATTRIBUTION_S
        self.exits.append(Exit(dyno.name, rc, now, killed))
        if now - dyno.started_at < STABLE_AFTER_S and not killed:
            dyno.delay_s = min(dyno.delay_s * 2, MAX_RESTART_DELAY_S)
        dyno.restart_at = now + dyno.delay_s

    # --- what the chaos loop uses ----------------------------------------------------------------
    def mark_killed(self, dyno: Dyno) -> None:
        """Record that the harness is about to SIGKILL this dyno's main process."""
        with self._lock:
            dyno.killed_at = time.monotonic()

    def down(self) -> list[Dyno]:
        """Dynos whose main process is not running now (dead, or waiting for their restart)."""
        with self._lock:
            return [d for d in self.dynos if not d.alive or d.restart_at is not None]

    def crash_exits(self) -> list[Exit]:
        """Exits the harness did not cause: a process that died by itself."""
        with self._lock:
            return [e for e in self.exits if not e.killed_by_harness]

    def log_tails(self, chars: int = LOG_TAIL_CHARS) -> str:
        """Every dyno's log, its last ``chars`` characters under the dyno's name: what a failure shows."""
        return "\n".join(f"--- {d.name}\n{d.log_path.read_text(errors='replace')[-chars:]}" for d in self.dynos)

    def stop(self) -> None:
        """SIGTERM every dyno's group at once, then SIGKILL the groups that outlive ``STOP_GRACE_S``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(MONITOR_INTERVAL_S * 10)
        procs = [d.proc.proc for d in self.dynos if d.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
        for proc in procs:  # the group, even when its leader is gone: orphaned pool children
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
