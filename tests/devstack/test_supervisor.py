"""The chaos harness's supervisor restarts whatever dies and tells its own kills from crashes.

Real processes: a Procfile whose lines are small Python programs. One keeps
running (SIGKILLed by the test), one exits by itself with code 3 (a crash), one
forks a child that must not outlive its dyno (an orphaned prefork child).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from devstack.infra.procfile import entries as read_procfile
from devstack.infra.supervisor import Dyno, Supervisor
from tests.kit.waiting import wait_until

WAIT_S = 20.0
PY = sys.executable
LONG = f"{PY} -c 'import time; time.sleep(300)'"
CRASH_ONCE = (f"{PY} -c 'import os, sys, time; p = sys.argv[1]; "
              "first = not os.path.exists(p); open(p, \"a\").close(); "
              "sys.exit(3) if first else time.sleep(300)' {marker}")
FORKS = (f"{PY} -c 'import os, time; pid = os.fork(); "
         "time.sleep(300)'")


def _procfile(tmp_path: Path) -> Path:
    path = tmp_path / "Procfile"
    path.write_text(f"# a comment\nweb: {LONG}\nlong: {LONG}\ncrash: {CRASH_ONCE.format(marker=tmp_path / 'crashed')}\n"
                    f"forks: {FORKS}\n")
    return path


def test_read_procfile_keeps_every_process_type(tmp_path: Path) -> None:
    entries = read_procfile(_procfile(tmp_path))
    assert list(entries) == ["web", "long", "crash", "forks"]
    assert entries["long"] == LONG


@pytest.fixture()
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    sup = Supervisor(read_procfile(_procfile(tmp_path)), {"long": 1, "crash": 1, "forks": 2}, {"PATH": "/usr/bin:/bin"},
                     tmp_path).start()
    yield sup
    sup.stop()


def _dyno(sup: Supervisor, name: str) -> Dyno:
    return next(d for d in sup.dynos if d.name == name)


def test_a_killed_dyno_is_restarted_and_the_kill_is_not_a_crash(supervisor: Supervisor) -> None:
    long = _dyno(supervisor, "long.1")
    first = wait_until(long.main_process, WAIT_S, "long.1 running")
    supervisor.mark_killed(long)
    first.send_signal(signal.SIGKILL)
    wait_until(lambda: long.starts == 2 and long.alive and long.main_process() is not None, WAIT_S,
               "long.1 restarted")
    restarted = long.main_process()
    assert restarted is not None
    assert restarted.pid != first.pid
    assert [e.dyno for e in supervisor.exits if e.killed_by_harness] == ["long.1"]
    assert not [e for e in supervisor.crash_exits() if e.dyno == "long.1"]


def test_a_process_that_exits_by_itself_is_a_crash_and_is_restarted(supervisor: Supervisor) -> None:
    crash = _dyno(supervisor, "crash.1")
    wait_until(lambda: crash.starts == 2 and crash.alive, WAIT_S, "crash.1 restarted after its exit")
    crashes = supervisor.crash_exits()
    assert [(e.dyno, e.returncode) for e in crashes] == [("crash.1", 3)]
    wait_until(lambda: not supervisor.down(), WAIT_S, "every dyno up")


def test_a_dead_dyno_leaves_no_orphaned_child(supervisor: Supervisor) -> None:
    forks = _dyno(supervisor, "forks.2")
    main = wait_until(lambda: forks.main_process() if forks.pool_children() else None, WAIT_S,
                      "forks.2 and its child")
    child = forks.pool_children()[0]
    supervisor.mark_killed(forks)
    main.send_signal(signal.SIGKILL)
    wait_until(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, WAIT_S,
               "the orphaned child torn down with its dyno")
    wait_until(lambda: forks.starts == 2 and forks.alive, WAIT_S, "forks.2 restarted")
    assert _dyno(supervisor, "forks.1").starts == 1  # the other copy of the process type was left alone


def _running(dyno: Dyno) -> psutil.Process:
    process = wait_until(dyno.main_process, WAIT_S, "running")
    return process


def test_stop_ends_every_dyno(tmp_path: Path) -> None:
    sup = Supervisor(read_procfile(_procfile(tmp_path)), {"long": 2}, {"PATH": "/usr/bin:/bin"}, tmp_path).start()
    pids = [_running(d).pid for d in sup.dynos]
    started = time.monotonic()
    sup.stop()
    assert all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE for pid in pids)
    assert time.monotonic() - started < WAIT_S
