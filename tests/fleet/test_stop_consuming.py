"""A worker told to stop gives its channel no credit, wherever the stop lands (``hardening/stop_consuming.py``).

Celery's answer is stood in for by a function that reads a real prefork pool's size, as Celery's
prefetch limit does; "the stop lands" is what Celery's cold-shutdown handler does on the main thread:
the stop flag, then the pool stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from celery.concurrency.prefork import TaskPool
from celery.platforms import EX_FAILURE, EX_OK
from celery.worker import state

from tasks.hardening.startup_stop import stopping
from tasks.hardening.stop_consuming import no_credit_while_stopping


@pytest.fixture(autouse=True)
def running() -> Iterator[None]:
    before = state.should_terminate, state.should_stop
    state.should_terminate = state.should_stop = None
    yield
    state.should_terminate, state.should_stop = before


def stopped_pool() -> TaskPool:
    """A prefork pool as Celery's cold shutdown leaves it: no billiard pool behind it."""
    return TaskPool(1)


def celery_answer(pool: TaskPool, landing: Callable[[], None] = lambda: None) -> Callable[[], bool]:
    """Celery's prefetch limit: the pool's size read, with the stop signal landing just before the read."""
    def answer() -> bool:
        landing()
        return pool.num_processes > 0

    return answer


def cold_shutdown() -> None:
    state.should_terminate = True


def test_a_stop_that_lands_inside_celerys_answer_gives_no_credit_and_no_error() -> None:
    """The full run's ``Unrecoverable error: AttributeError(... '_processes')``: the first check passed,
    then the handler stopped the pool Celery was about to read."""
    assert no_credit_while_stopping(celery_answer(stopped_pool(), landing=cold_shutdown)) is False


def test_a_stop_that_lands_after_celery_said_yes_gives_no_credit() -> None:
    def yes_then_stop() -> bool:
        cold_shutdown()
        return True

    assert no_credit_while_stopping(yes_then_stop) is False


def test_a_running_worker_gets_celerys_answer() -> None:
    assert no_credit_while_stopping(lambda: True) is True
    assert no_credit_while_stopping(lambda: False) is False


@pytest.mark.parametrize(("flag", "exit_code"), [("should_terminate", EX_FAILURE), ("should_stop", EX_OK)])
def test_a_worker_told_to_stop_warm_or_cold_is_not_asked(flag: str, exit_code: int) -> None:
    """A flag holds the stop's exit code: a warm stop's, ``EX_OK``, is 0 and still a stop."""
    setattr(state, flag, exit_code)
    assert stopping()
    assert no_credit_while_stopping(celery_answer(stopped_pool())) is False


def test_a_broken_pool_of_a_running_worker_is_not_hidden() -> None:
    with pytest.raises(AttributeError, match="_processes"):
        no_credit_while_stopping(celery_answer(stopped_pool()))
