"""A socket left open fails a later test; tests/kit/socket_origin.py names the test and line that made it."""

from __future__ import annotations

from pathlib import Path

from tests.kit.inner_pytest import run_with_plugin

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
    out = run_with_plugin(tmp_path, "socket_origin", "test_leaky.py", LEAKY_MODULE)
    assert "FAILED test_leaky.py::test_collects_garbage" in out, out  # the leak fails a later test, as in a run
    assert "socket made during test_leaky.py::test_leaks_a_socket_in_a_cycle (call) on thread 'MainThread'" in out, out
    assert "test_leaky.py:7 in make_and_drop" in out, out
    assert "test_leaky.py:12 in test_leaks_a_socket_in_a_cycle" in out, out
