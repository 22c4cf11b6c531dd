"""A threads pool stopped inside a signal handler that landed in a task's hand-off stops once the
hand-off returns, and one told to kill a task still running leaves it to end (``tasks/hardening/thread_stop.py``).

Celery's cold shutdown (the Procfile's ``REMAP_SIGTERM=SIGQUIT``, the ``garmin`` line's ``-P threads``)
stops the pool on the main thread from the signal handler. Here the handler runs where it hurt:
inside ``ThreadPoolExecutor.submit``, while it holds the executor's lock to start a thread. Once the
soft-shutdown window is over, it cancels the tasks still running through the pool's ``terminate_job``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import pytest
from celery.concurrency.thread import TaskPool
from celery.utils.log import in_sighandler

import tasks
from tasks.hardening.thread_stop import SignalSafeThreadStop, make_signal_safe
from tests.kit.waiting import wait_until

HAND_OFF_BOUND_S = 10.0  # the hand-off takes milliseconds; a stop that waits on it never returns


def test_every_worker_makes_a_threads_pools_stop_signal_safe() -> None:
    assert SignalSafeThreadStop in tasks.app.steps["worker"]


def _stopped(pool: TaskPool) -> bool:
    try:
        pool.executor.submit(int).cancel()
    except RuntimeError:  # "cannot schedule new futures after shutdown"
        return True
    return False


def test_a_stop_run_inside_a_hand_off_returns_and_the_pool_stops_once_the_hand_off_has() -> None:
    pool = TaskPool(2)
    make_signal_safe(pool)  # what the worker bootstep does
    pool.start()
    executor = pool.executor
    start_thread = executor._adjust_thread_count  # submit runs this with the executor's lock held
    ran = threading.Event()

    def landed() -> None:
        executor._adjust_thread_count = start_thread  # the signal lands once
        pool.stop()  # Celery's cold-shutdown handler, run in the frame the signal landed in
        start_thread()

    executor._adjust_thread_count = landed
    handed_off = threading.Event()

    def main_thread() -> None:
        pool.apply_async(ran.set, args=())
        handed_off.set()

    threading.Thread(target=main_thread, daemon=True).start()
    assert handed_off.wait(HAND_OFF_BOUND_S), "the stop waited on the hand-off it interrupted"
    wait_until(lambda: _stopped(pool), HAND_OFF_BOUND_S, "the pool to stop once the hand-off returned")


def test_a_stop_outside_a_hand_off_stops_the_pool_at_once() -> None:
    pool = TaskPool(1)
    make_signal_safe(pool)
    pool.start()
    done = threading.Event()
    pool.apply_async(done.set, args=())
    assert done.wait(HAND_OFF_BOUND_S)
    pool.stop()
    assert _stopped(pool)


def test_a_task_still_running_when_the_cold_shutdown_cancels_it_is_left_to_end(
        caplog: pytest.LogCaptureFixture) -> None:
    """A full run's ``garmin`` worker, stopped while Garmin held a request past the soft window:
    ``Unrecoverable error: NotImplementedError(... does not implement kill_job)`` and exit 1."""
    pool = TaskPool(1)
    make_signal_safe(pool)
    pool.start()
    running, release, ended = threading.Event(), threading.Event(), threading.Event()

    def task() -> None:
        running.set()
        release.wait(HAND_OFF_BOUND_S)
        ended.set()

    pool.apply_async(task, args=())
    assert running.wait(HAND_OFF_BOUND_S)
    with caplog.at_level(logging.WARNING), in_sighandler():  # Celery's cold-shutdown handler, as it runs
        pool.terminate_job(os.getpid(), signal.SIGTERM)  # what celery.worker.request.Request.cancel calls
    assert "cannot be killed; it ends by itself" in caplog.text
    assert not ended.is_set()
    release.set()
    assert ended.wait(HAND_OFF_BOUND_S)
    pool.stop()
    assert _stopped(pool)


def test_a_terminate_outside_a_stop_is_still_refused() -> None:
    """``revoke --terminate`` (Flower's Terminate button) runs in the event loop: a thread cannot be
    killed, and Celery says so rather than recording a task terminated that runs on."""
    pool = TaskPool(1)
    make_signal_safe(pool)
    with pytest.raises(NotImplementedError, match="kill_job"):
        pool.terminate_job(os.getpid(), signal.SIGTERM)
