"""``--gc-each-test`` (tests/kit/leak_hunt.py) fails the test that dropped a socket in a cycle, not a later one."""

from __future__ import annotations

from pathlib import Path

from tests.kit.inner_pytest import run_with_plugin

LEAKY_MODULE = '''
import socket


def test_leaks_a_socket_in_a_cycle():
    holder = {"sock": socket.socket()}
    holder["self"] = holder  # freed only by the collector, whenever it next runs


def test_opens_nothing():
    pass
'''


def test_the_leak_fails_the_test_that_left_it(tmp_path: Path) -> None:
    out = run_with_plugin(tmp_path, "leak_hunt", "test_leaky.py", LEAKY_MODULE, "--gc-each-test")
    assert "ERROR test_leaky.py::test_leaks_a_socket_in_a_cycle" in out, out
    assert "ERROR test_leaky.py::test_opens_nothing" not in out, out
    assert "unclosed <socket.socket" in out, out
