"""``--gc-each-test`` (tests/kit/leak_hunt.py) fails the test that dropped a socket in a cycle, not a later one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

KIT = Path(__file__).resolve().parents[1] / "kit"

LEAKY_MODULE = '''
import socket


def test_leaks_a_socket_in_a_cycle():
    holder = {"sock": socket.socket()}
    holder["self"] = holder  # freed only by the collector, whenever it next runs


def test_opens_nothing():
    pass
'''


def test_the_leak_fails_the_test_that_left_it(tmp_path: Path) -> None:
    (tmp_path / "leak_hunt.py").write_text((KIT / "leak_hunt.py").read_text())
    (tmp_path / "test_leaky.py").write_text(LEAKY_MODULE)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "leak_hunt", "--gc-each-test", "-p", "no:cacheprovider",
                          "-W", "error::ResourceWarning", "-W", "error::pytest.PytestUnraisableExceptionWarning",
                          "-rA", "test_leaky.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "ERROR test_leaky.py::test_leaks_a_socket_in_a_cycle" in run.stdout, run.stdout
    assert "ERROR test_leaky.py::test_opens_nothing" not in run.stdout, run.stdout
    assert "unclosed <socket.socket" in run.stdout, run.stdout
