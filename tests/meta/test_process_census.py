"""The process census: every Python process of a run, with the hook on its path, leaves one line at exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.kit.process_census import CENSUS_ENV, SITE_DIR, kind, summarise


def test_a_process_with_the_hook_on_its_path_records_its_cpu_and_command_line(tmp_path: Path) -> None:
    census = tmp_path / "census.tsv"
    env = dict(os.environ, PYTHONPATH=str(SITE_DIR), **{CENSUS_ENV: str(census)})
    subprocess.run([sys.executable, "-c", "sum(range(10**6))"], env=env, check=True, timeout=60)
    subprocess.run([sys.executable, "-c", "import os; os._exit(0)"], env=env, check=True, timeout=60)
    [line] = census.read_text().splitlines()  # os._exit skips atexit: that process is not counted
    _pid, own, kids, _alive, module, argv = line.split("\t")
    assert float(own) > 0 and float(kids) == 0 and argv == "-c"
    assert module == os.environ["PYTEST_CURRENT_TEST"].split("::")[0]  # the module of the test that started it
    without = dict(env)
    del without[CENSUS_ENV]
    subprocess.run([sys.executable, "-c", "pass"], env=without, check=True, timeout=60)
    assert len(census.read_text().splitlines()) == 1


def test_processes_are_summed_by_kind_with_a_tests_own_pool_names_folded(tmp_path: Path) -> None:
    venv = "/repo/.venv/lib/python3.11/site-packages"
    assert kind(f"{venv}/celery/__main__.py -A tasks worker -Q gpu -P prefork -c 1 -n gpu@t -l INFO") \
        == "celery worker -Q gpu -P prefork -c 1"
    assert kind(f"{venv}/celery/__main__.py -A tasks worker -Q provider.sy-0dcce3 -P prefork -c 2") \
        == "celery worker -Q provider.sy-* -P prefork -c 2"
    assert kind(f"{venv}/celery/__main__.py -A tasks beat -S x -l INFO") == "celery beat"
    assert kind("/repo/bridges/__main__.py voicy") == "bridges voicy"
    assert kind("/repo/ops/__main__.py check cairn --timeout 10") == "ops check"
    assert kind("/repo/.venv/bin/honcho -e /tmp/pytest-of-root/pytest-43/env start") == "honcho"
    assert kind(f"{venv}/pytest/__main__.py -n 6 --dist loadfile").startswith("pytest")
    census = tmp_path / "census.tsv"
    census.write_text("1\t2.0\t1.0\t5.0\ttests/a.py\t/repo/bridges/__main__.py voicy\n"
                      "2\t1.0\t0.0\t5.0\ttests/b.py\t/repo/bridges/__main__.py voicy\n"
                      "3\t9.0\t4.0\t9.0\t-\t-c\n")  # an xdist worker, as execnet starts it
    text = summarise(census)
    assert text.startswith("pytest processes 9 CPU-s; the processes they started 4 CPU-s (2 of them)")
    assert "2\t4.0\t2.00\t1.0\tbridges voicy" in text.splitlines()
    per_module = summarise(census, by_module=True).splitlines()
    assert "1\t3.0\t3.00\t1.0\ttests/a.py" in per_module and "1\t1.0\t1.00\t0.0\ttests/b.py" in per_module
