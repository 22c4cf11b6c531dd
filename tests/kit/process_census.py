"""Suite CPU per kind of process: ``python -m tests.kit.process_census FILE`` sums a census file.

``pytest --cpu-profile`` charges a fleet process's CPU to the test that stopped it; this counts it
by what the process was (a Celery pool, a bridge, beat, an ops command). Take a census with::

    PYTHONPATH=$PWD/tests/kit/census_site SWITCHYARD_CENSUS=/tmp/census.tsv make test

and sum it per kind (``python -m tests.kit.process_census FILE``) or per test module that started the
processes (``python -m tests.kit.process_census --by-module FILE``).

Every Python process of the run then appends one line at exit (``census_site/sitecustomize.py``).
The pytest processes' children column holds everything they started, so it is left out of the total;
a runner's (the demo's, honcho's) holds its fleet, whose processes have rows of their own too.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

SITE_DIR = Path(__file__).resolve().parent / "census_site"
CENSUS_ENV = "SWITCHYARD_CENSUS"
CELERY = re.compile(r"celery(?:/__main__\.py| )(?:.*?-A \S+ )?(worker|beat|flower)\b")
OPTION = {flag: re.compile(rf" {flag} (\S+)") for flag in ("-Q", "-P", "-c")}
PYTHON_MODULE = re.compile(r"/([a-z_]+)/__main__\.py(?: ([a-z_-]+))?")
# pytest's own processes: the controller and an xdist worker (execnet starts it with ``python -c``); a
# fleet process may name a path under pytest's temporary directory, so "pytest" anywhere is not enough.
PYTEST = re.compile(r"^(?:-c\b|\S*/pytest/__main__\.py\b)")
UNIQUE_SUFFIX = re.compile(r"-[0-9a-f]{4,}\b")  # a test's own pool name: provider.sy-0dcce3
DEFAULT_ROWS = 30


def kind(argv: str) -> str:
    """What a process was, from its command line: ``celery worker -Q gpu -P prefork -c 1``, ``bridges voicy``."""
    if PYTEST.match(argv):
        return "pytest (xdist worker or a test's python -c)"
    if (celery := CELERY.search(argv)) is not None:
        opts = " ".join(f"{flag} {m[1]}" for flag, rx in OPTION.items() if (m := rx.search(argv)) is not None)
        return UNIQUE_SUFFIX.sub("-*", f"celery {celery[1]} {opts}".rstrip())
    if (module := PYTHON_MODULE.search(argv)) is not None:
        return " ".join(part for part in module.groups() if part)
    return argv.split(" ")[0].rsplit("/", 1)[-1]


def summarise(path: Path, rows: int = DEFAULT_ROWS, by_module: bool = False) -> str:
    """Sum a census per kind of process, or per test module that started the process (``by_module``), so
    the modules whose fleets cost the most show first."""
    kinds: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for line in path.read_text().splitlines():
        _pid, own, kids, _alive, module, argv = line.split("\t", 5)
        name = kind(argv)
        row = kinds[name if not by_module or name.startswith("pytest") else module]
        row[0] += 1
        row[1] += float(own)
        row[2] += float(kids)
    fleet = {name: row for name, row in kinds.items() if not name.startswith("pytest")}
    pytest_own = sum(row[1] for name, row in kinds.items() if name.startswith("pytest"))
    total = sum(row[1] + row[2] for row in fleet.values())
    lines = [f"pytest processes {pytest_own:.0f} CPU-s; the processes they started {total:.0f} CPU-s "
             f"({sum(int(r[0]) for r in fleet.values())} of them)", "", "n\tcpu_s\tper\tkids\tkind"]
    for name, (n, own_s, kids_s) in sorted(fleet.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))[:rows]:
        lines.append(f"{int(n)}\t{own_s + kids_s:.1f}\t{(own_s + kids_s) / n:.2f}\t{kids_s:.1f}\t{name}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarise(Path(sys.argv[-1]), by_module="--by-module" in sys.argv[1:-1]))
