"""A socket left open fails a later test; tests/kit/socket_origin.py names the test and line that made it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

KIT = Path(__file__).resolve().parents[1] / "kit"

LEAKY_MODULE = '''
import gc
import socket


def make_and_drop():
    holder = {"sock": socket.socket()}
    holder["self"] = holder  # freed only by the collector, whenever it next runs


def test_leaks_a_socket_in_a_cycle():
    make_and_drop()


def test_collects_garbage():
    gc.collect()
'''


def test_the_failure_names_the_test_thread_and_line_that_made_the_socket(tmp_path: Path) -> None:
    (tmp_path / "socket_origin.py").write_text((KIT / "socket_origin.py").read_text())
    (tmp_path / "test_leaky.py").write_text(LEAKY_MODULE)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "socket_origin", "-p", "no:cacheprovider",
                          "-W", "error::ResourceWarning", "-W", "error::pytest.PytestUnraisableExceptionWarning",
                          "-rA", "test_leaky.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    out = run.stdout
    assert "FAILED test_leaky.py::test_collects_garbage" in out, out  # the leak fails a later test, as in a run
    assert "socket made during test_leaky.py::test_leaks_a_socket_in_a_cycle (call) on thread 'MainThread'" in out, out
    assert "test_leaky.py:7 in make_and_drop" in out, out
    assert "test_leaky.py:12 in test_leaks_a_socket_in_a_cycle" in out, out

