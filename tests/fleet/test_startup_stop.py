"""A pool child that a stop during start-up ends is reaped quietly (``tasks/hardening/startup_stop.py``).

A real billiard pool of this process whose child is still initialising, as a worker's child is
when the stop reaches its group early; the worker around the pool is a stub, as only its
``pool`` attribute is read.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from billiard import util
from billiard.pool import Pool

from tasks.hardening import startup_stop
from tests.kit.waiting import wait_until

INITIALISING_S = 60.0  # each child sleeps this long in its initializer: the test ends it long before
REPLACED_TIMEOUT_S = 10.0  # billiard's supervisor thread looks for ended children every 0.1 s


@pytest.fixture()
def pool() -> Iterator[Pool]:
    # Children that never reach the task queue: one killed while waiting on it would keep its lock,
    # and terminate() would wait for that lock for ever.
    pool = Pool(processes=1, initializer=time.sleep, initargs=(INITIALISING_S,))
    try:
        yield pool
    finally:
        pool.terminate()
        pool.join()


@pytest.fixture()
def billiard_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    logger = util.get_logger()  # billiard's own ("multiprocessing"): it does not propagate
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def end_child_and_wait_for_its_replacement(pool: Pool) -> None:
    """SIGTERM's default action ends the initialising child; billiard's supervisor reaps and replaces it."""
    (child,) = pool._pool
    os.kill(child.pid, signal.SIGTERM)
    wait_until(lambda: started_children(pool) not in ([child.pid], []), REPLACED_TIMEOUT_S,
               "billiard to reap the ended child and start another")


def started_children(pool: Pool) -> list[int]:
    """The pids of the pool's children; a child billiard has listed but not yet started has none."""
    pids = [p.pid for p in list(pool._pool)]
    return [] if None in pids else pids


def child_ends_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.levelname} {r.getMessage()}" for r in caplog.records if "exited with" in r.getMessage()]


def test_a_child_the_stop_ends_is_reaped_without_an_error_and_one_without_a_stop_is_not(
        pool: Pool, billiard_log: pytest.LogCaptureFixture) -> None:
    startup_stop._expect_children_stopped(SimpleNamespace(pool=SimpleNamespace(_pool=pool)))  # the stop came
    end_child_and_wait_for_its_replacement(pool)
    assert child_ends_logged(billiard_log) == []
    # its replacement was forked after the stop was flagged: ended, it is reported as billiard always does
    end_child_and_wait_for_its_replacement(pool)
    (line,) = child_ends_logged(billiard_log)
    assert line.startswith("ERROR ") and "signal 15 (SIGTERM)" in line


def test_a_worker_whose_pool_has_not_started_is_left_as_it_is() -> None:
    worker = SimpleNamespace(pool=SimpleNamespace())
    startup_stop._expect_children_stopped(worker)
    assert worker.pool.did_start_ok()
