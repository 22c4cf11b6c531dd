"""The ``slow`` marker, enforced: a test not marked ``slow`` may not start a fleet process.

``make check`` runs ``-m "not slow"`` as the edit loop's fast tier, and promises
that it starts no fleet process (a Celery worker, beat or Flower, a bridge, a
Procfile line through honcho or bash, the demo). A marker that is only a
convention drifts, so while an unmarked test runs this plugin watches the
pytest process's descendants (through /proc, every ``POLL_INTERVAL_S`` and once
more when the test body returns, before its fixtures stop anything) and fails
the test naming the process it saw. Services (redis-server, nats-server, moto)
and one-off ``python -c`` probes are not fleet processes and are allowed. A fleet
process already running before the test's set-up starts is not the test's own: a
module-scoped stack that a slow test of the module started (slow tests run first,
``tests/conftest.py``) outlives it into the module's unmarked tests.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

POLL_INTERVAL_S = 0.5
PROC = Path("/proc")
# What a fleet process's command line looks like (the Procfile's lines, the test kit's spawns, the demo).
FLEET_COMMAND = re.compile(r"(?:^|\s|/)(?:celery\s.*\s(?:worker|beat|flower)\b"
                           r"|-m\s+(?:celery\s|bridges\b|deploy\.demo\b)|honcho\s+start\b)")


def _ppid(pid: str) -> int | None:
    try:
        stat = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])  # the field after the state; comm may hold spaces


def _cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _children_by_ppid() -> dict[int, list[int]]:
    """Every process's children, from every process's ``stat`` (one read per process on the box)."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (ppid := _ppid(entry.name)) is not None:
            children.setdefault(ppid, []).append(int(entry.name))
    return children


def _children_of(pid: int) -> list[int] | None:
    """``pid``'s children from the kernel's own lists (``/proc/<pid>/task/<tid>/children``, one per
    thread); ``None`` where the kernel has no such file (built without ``CONFIG_PROC_CHILDREN``)."""
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return []  # gone
    found: list[int] = []
    for task in tasks:
        try:
            found.extend(int(child) for child in (task / "children").read_text().split())
        except FileNotFoundError:
            if not task.exists():
                continue  # the thread ended
            return None
        except OSError:
            continue
    return found


def fleet_descendants(root: int) -> dict[int, str]:
    """The command lines of ``root``'s live descendants that are fleet processes, by pid.

    Walked down from ``root`` through the kernel's children lists: a scan reads the files of this
    test's own descendants only, not of every process on the shared box (the guard scans at every
    unmarked test's start and end and twice a second while it runs: hundreds of processes at 2–10 ms a
    scan). Where the kernel has no children lists, every process's ``stat`` gives the tree instead."""
    by_ppid: dict[int, list[int]] | None = None
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        kids = _children_of(pid) if by_ppid is None else None
        if kids is None:
            by_ppid = by_ppid if by_ppid is not None else _children_by_ppid()
            kids = by_ppid.get(pid, [])
        todo.extend(kids)
        if pid != root and FLEET_COMMAND.search(cmd := _cmdline(pid)):
            found[pid] = cmd
    return found


class Watcher:
    """Polls for fleet descendants of this process until stopped; ``seen`` holds the first found."""

    def __init__(self, before: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        self.seen: list[str] = []
        self._before = before  # running before the test's set-up: an earlier test's module fixture
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-guard", daemon=True)

    def _run(self) -> None:
        while not self.seen and not self._stop.wait(POLL_INTERVAL_S):
            self.check()

    def check(self) -> None:
        if not self.seen:
            self.seen = [cmd for pid, cmd in fleet_descendants(os.getpid()).items() if pid not in self._before]

    def __enter__(self) -> Watcher:
        self.check()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.check()


BEFORE_SETUP = pytest.StashKey[set[int]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("slow") is None and PROC.is_dir():
        item.stash[BEFORE_SETUP] = set(fleet_descendants(os.getpid()))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("slow") is not None or not PROC.is_dir():
        return (yield)
    with Watcher(item.stash.get(BEFORE_SETUP, set())) as watcher:
        result = yield  # a failing test raises here: its own failure is the one reported
    if watcher.seen:
        pytest.fail("this test started a fleet process, so it must be marked slow "
                    f"(@pytest.mark.slow or a module's pytestmark): {watcher.seen[0][:200]}", pytrace=False)
    return result
