"""``--cpu-profile=FILE``: each test's CPU time, its children's included, as tab-separated lines.

The suite's targets are set by CPU, not wall time: on the shared 2-core box the wall clock measures
the neighbours, while user + sys seconds measure the suite. ``--durations`` gives wall time only, and
a test whose cost is in the fleet processes it starts (Celery workers, bridges, nats-server) shows
nothing in the pytest process's own CPU. So this plugin records, per test and per phase (setup, call,
teardown), the deltas of ``getrusage(RUSAGE_SELF)`` and ``getrusage(RUSAGE_CHILDREN)``. A child's CPU
is counted when it is reaped, which is when the test (or its fixture's teardown) stops it: a
module-scoped stack's CPU lands on its module's last teardown, a session service's on the last test.
Run it serially for per-test figures (``-p no:xdist`` or ``-n 0``); under xdist each worker writes
``FILE.<worker id>``, and the plugin must be named on the command line (``-p tests.kit.cpu_profile``:
an xdist worker parses its options before it reads the conftest that lists this plugin).

Columns: nodeid, phase, wall_s, self_cpu_s, children_cpu_s. Summarise with
``python -m tests.kit.cpu_profile FILE...`` (tests by total CPU, then modules).
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

OPTION = "--cpu-profile"
TOP_TESTS = 60
TOP_MODULES = 40


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(OPTION, default=None, metavar="FILE",
                     help="write each test's wall and CPU (children included) per phase to FILE")


class _Recorder:
    def __init__(self, path: Path) -> None:
        self.out = path.open("w", buffering=1)

    def measure(self, item: pytest.Item, phase: str) -> Iterator[None]:
        wall, own, kids = time.monotonic(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
        try:
            return (yield)
        finally:
            self.out.write(f"{item.nodeid}\t{phase}\t{time.monotonic() - wall:.3f}\t"
                           f"{_cpu(resource.RUSAGE_SELF) - own:.3f}\t{_cpu(resource.RUSAGE_CHILDREN) - kids:.3f}\n")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption(OPTION)
    if not path:
        return
    if config.inipath is None:
        # Spelt ``--cpu-profile FILE``, an xdist worker (and pytest, before the plugin is known) reads
        # FILE as a test path and takes its folder as the rootdir: no pyproject.toml, so no markers,
        # no filterwarnings, no addopts. The run would measure a different suite.
        raise pytest.UsageError(f"{OPTION}: no pytest configuration was read (rootdir {config.rootpath}); "
                                f"write {OPTION}={path}")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    recorder = _Recorder(Path(f"{path}.{worker}" if worker else path))

    class Plugin:
        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
            return (yield from recorder.measure(item, "setup"))

        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
            return (yield from recorder.measure(item, "call"))

        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
            return (yield from recorder.measure(item, "teardown"))

    config.pluginmanager.register(Plugin(), "cpu_profile_recorder")


def summarise(paths: list[str]) -> str:
    tests: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for path in paths:
        for line in Path(path).read_text().splitlines():
            nodeid, _phase, wall, own, kids = line.split("\t")
            row = tests[nodeid]
            row[0] += float(wall)
            row[1] += float(own)
            row[2] += float(kids)
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for nodeid, row in tests.items():
        for i, value in enumerate(row):
            modules[nodeid.split("::")[0]][i] += value
    total = [sum(r[i] for r in tests.values()) for i in range(3)]
    lines = [f"{len(tests)} tests: wall {total[0]:.0f} s, CPU {total[1] + total[2]:.0f} s "
             f"(pytest {total[1]:.0f} s, children {total[2]:.0f} s)", "", "cpu_s\twall_s\tself\tkids\ttest"]
    for nodeid, (wall_s, own_s, kids_s) in sorted(tests.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))[:TOP_TESTS]:
        lines.append(f"{own_s + kids_s:.1f}\t{wall_s:.1f}\t{own_s:.1f}\t{kids_s:.1f}\t{nodeid}")
    lines += ["", "cpu_s\twall_s\tself\tkids\tmodule"]
    for module, (wall_s, own_s, kids_s) in sorted(modules.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))[:TOP_MODULES]:
        lines.append(f"{own_s + kids_s:.1f}\t{wall_s:.1f}\t{own_s:.1f}\t{kids_s:.1f}\t{module}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarise(sys.argv[1:]))
