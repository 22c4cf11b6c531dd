"""Procfile lines run the way honcho and Heroku run them: ``bash -c <command>`` in a process group of its own.

Used by the Procfile, presence, restart, Sentinel and Flower tests: every
process they start is the Procfile's own command line, not a hand-built one.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devstack.infra.procs import Proc, spawn, stop_group

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
PROCFILE = ROOT / "Procfile"
READY_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
# Heroku runs each command with bash, which execs a lone simple command, so the exit
# status we see is the process's own (dash, honcho's /bin/sh, would report its own death).
SHELL = shutil.which("bash") or "/bin/sh"
_PROCFILE_LINE = re.compile(r"^([A-Za-z0-9_-]+):\s*(.+)$")  # honcho's own pattern


def procfile_entries() -> dict[str, str]:
    entries: dict[str, str] = {}
    for line in PROCFILE.read_text().splitlines():
        match = _PROCFILE_LINE.match(line)
        if match:
            assert match[1] not in entries, f"process type {match[1]} declared twice"
            entries[match[1]] = match[2]
    return entries


def fleet_env(redis_url: str, **extra: str) -> dict[str, str]:
    """A clean environment: no inherited Voicy/Cairn/Flower/platform variables."""
    drop = ("VOICY_", "CAIRN_", "FLOWER_", "HONCHO_", "DYNO", "REMAP_SIGTERM", "PORT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", REDIS_URL=redis_url,
               PYTHONUNBUFFERED="1", LOG_LEVEL="INFO")
    env.update(extra)
    return env


class ProcfileProcess:
    """One Procfile command started like honcho does; its output is watched line by line."""

    def __init__(self, ptype: str, env: dict[str, str], log_path: Path) -> None:
        self.ptype, self.command = ptype, procfile_entries()[ptype]
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._log = open(log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen([SHELL, "-c", self.command], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, name=f"out-{ptype}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            self._log.write(line)
            self._log.flush()
            with self._cond:
                self._lines.append(line)
                self._cond.notify_all()
        self.proc.stdout.close()  # the output ended: the reader owns the pipe
        with self._cond:
            self._cond.notify_all()

    def output(self) -> str:
        with self._cond:
            return "".join(self._lines)

    def wait_for_output(self, pattern: str, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Block until a line matches ``pattern`` (each new line is an event); fail if the process exits."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            seen = 0
            while True:
                for line in self._lines[seen:]:
                    if regex.search(line):
                        return line
                seen = len(self._lines)
                if not self._reader.is_alive():
                    raise AssertionError(f"{self.ptype} exited ({self.proc.poll()}) before /{pattern}/:\n"
                                         f"{''.join(self._lines)[-4000:]}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"{self.ptype}: no /{pattern}/ within {timeout_s}s:\n"
                                         f"{''.join(self._lines)[-4000:]}")
                self._cond.wait(remaining)

    def wait_exit(self, timeout_s: float = EXIT_TIMEOUT_S) -> int:
        code = self.proc.wait(timeout_s)
        self._reader.join(timeout_s)
        return code

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Signal the whole process group, as honcho and the Heroku dyno manager do."""
        stop_group(self.proc, sig, STOP_TIMEOUT_S)
        self._reader.join(STOP_TIMEOUT_S)
        self._log.close()
        return self.proc.returncode


@pytest.fixture()
def launch(tmp_path: Path) -> Iterator[Callable[..., ProcfileProcess]]:
    started: list[ProcfileProcess] = []

    def start(ptype: str, env: dict[str, str]) -> ProcfileProcess:
        proc = ProcfileProcess(ptype, env, tmp_path / f"{ptype}-{len(started)}.log")
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        proc.stop()


def start_procfile_beat(env: dict[str, str], log_path: Path) -> Proc:
    """The Procfile's own ``beat`` line (the RedBeat scheduler that keeps its lock), ``celery`` from this venv."""
    env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}
    return spawn([SHELL, "-c", procfile_entries()["beat"]], env, log_path)


def assert_alive(procs: dict[str, Callable[[], int | None]], logs: Callable[[], str]) -> None:
    """None of ``procs`` (name → its ``poll``) has exited; else name them with the end of ``logs()``."""
    dead = {name: code for name, poll in procs.items() if (code := poll()) is not None}
    assert not dead, f"exited: {dead}\n{logs()[-4000:]}"
