"""``--gc-each-test``: a full garbage collection after each test's teardown, to find what leaks late.

A socket, file or pipe left open is an error in this suite (``filterwarnings`` in pyproject.toml).
One dropped inside a reference cycle warns only when the collector frees the cycle, which fails
whichever test that xdist worker is running at the time: a test that opened nothing. With this
option the collection runs after each test's fixtures (and each module's) are torn down, inside the
teardown phase, so the leak fails the test that left it. ``PYTHONTRACEMALLOC=20``
adds where the object was allocated. Off by default: a collection per test added about 200 CPU-s
(30 %) to the whole suite. Under xdist name the plugin as well (``-p tests.kit.leak_hunt
--gc-each-test``), as for ``tests/kit/cpu_profile.py``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

OPTION = "--gc-each-test"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(OPTION, action="store_true", default=False,
                     help="collect garbage after each test, so a resource leaked in a cycle fails that test")


# Autouse fixtures: each is set up before the other fixtures of its scope, so torn down after them,
# and the collection runs inside the teardown phase, before pytest's unraisableexception plugin reads
# that phase's warnings. Without the option each is one check per test or module.
@pytest.fixture(autouse=True)
def _collect_after_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if request.config.getoption(OPTION):
        gc.collect()


@pytest.fixture(scope="module", autouse=True)
def _collect_after_each_module(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if request.config.getoption(OPTION):
        gc.collect()
