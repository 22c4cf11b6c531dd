"""A prefork pool stopped inside a signal handler still fires the loop's timers while it drains
(``tasks/hardening/stop_timers.py``).

Celery's cold shutdown (the Procfile's ``REMAP_SIGTERM=SIGQUIT``) stops the pool on the main thread
from the signal handler; the drain's timer thread then steps the hub's scheduler and sends the event
heartbeat. Here the handler runs where it hurt, as a signal landing there runs it: inside that
scheduler's generator, inside a read of the scheduler, inside an event publish, or inside the loop's
``call_soon``. A real pool child holds its work until a timer entry
releases it, so the drain ends only through a timer fired during it.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Callable, Iterator

import pytest
from celery.concurrency.prefork import TaskPool
from kombu import Connection
from kombu.asynchronous import Hub, get_event_loop, set_event_loop
from kombu.asynchronous.timer import Timer

import tasks
from tasks.hardening.stop_timers import (
    DrainTimers,
    fire_with_own_scheduler,
    skip_events_held_by_the_stop,
    skip_ready_held_by_the_stop,
)

HOSTNAME = "stop-timers@test"
WORK_BOUND_S = 20.0  # the child gives up waiting for the timer after this: the drain then ends unfired
SCHEDULER_LOCK = Hub.__dict__["scheduler"].lock  # kombu's cached_property takes it on every read of hub.scheduler
_released = multiprocessing.Event()  # created before the pool forks: the child inherits it


def _work_in_hand() -> bool:
    """The pool child's task: runs until the timer entry releases it."""
    return _released.wait(WORK_BOUND_S)


def _pool_in_hand(wrap: Callable[[Callable[[], None]], Callable[[], None]]) -> TaskPool:
    """A started prefork pool whose ``on_stop`` is ``wrap``-ped, as the worker bootstep does, and whose one
    child runs :func:`_work_in_hand`."""
    pool = TaskPool(1, initargs=(tasks.app, HOSTNAME))
    pool.on_stop = wrap(pool.on_stop)
    pool.start()
    started = threading.Event()
    pool.apply_async(_work_in_hand, accept_callback=lambda *_: started.set())
    assert started.wait(WORK_BOUND_S), "the pool child took no work"
    return pool


def _release_from_the_drain(hub: Hub) -> list[str]:
    """A timer entry due at once that releases the pool child; the names of the threads that fired it."""
    fired: list[str] = []

    def entry() -> None:
        fired.append(threading.current_thread().name)
        _released.set()

    hub.call_later(0, entry)
    return fired


@pytest.fixture()
def hub() -> Iterator[Hub]:
    before = get_event_loop()
    loop = Hub(Timer())
    set_event_loop(loop)
    _released.clear()
    yield loop
    _released.set()
    set_event_loop(before)


def test_every_worker_wraps_its_pools_stop() -> None:
    assert DrainTimers in tasks.app.steps["worker"]


def test_a_stop_run_inside_the_scheduler_still_fires_timers_while_the_pool_drains(
        hub: Hub, caplog: pytest.LogCaptureFixture) -> None:
    pool = _pool_in_hand(fire_with_own_scheduler)
    fired = _release_from_the_drain(hub)

    def interrupted() -> Iterator[tuple[float | None, object]]:
        pool.stop()  # Celery's cold-shutdown handler, run in the frame the signal landed in
        yield from iter(hub.timer)

    scheduler = hub.scheduler = interrupted()
    with caplog.at_level(logging.WARNING):
        next(scheduler)
    assert fired == ["prefork-timer-shutdown"]  # fired by the drain's own thread, once
    assert hub.scheduler is scheduler  # the interrupted frame goes on with its own scheduler
    assert "Exception in timer thread" not in caplog.text and "generator already executing" not in caplog.text


def test_a_stop_run_inside_an_event_publish_drains_with_timers_and_events_back_on_after(
        hub: Hub, caplog: pytest.LogCaptureFixture) -> None:
    with Connection("memory://") as connection:
        events = tasks.app.events.Dispatcher(connection, hostname=HOSTNAME, enabled=True)
        pool = _pool_in_hand(lambda stop: skip_events_held_by_the_stop(stop, lambda: events))
        fired: list[object] = []

        def heartbeat() -> None:  # celery.worker.heartbeat.Heart's timer entry, then the child's release
            fired.append(events.send("worker-heartbeat"))
            _released.set()

        hub.call_later(0, heartbeat)
        with caplog.at_level(logging.INFO), events.mutex:  # the frame the signal landed in was publishing
            pool.stop()  # Celery's cold-shutdown handler
        assert fired == [None]  # the heartbeat fired during the drain, and was skipped, not waited on
        assert "did not terminate cleanly" not in caplog.text, caplog.text
        assert "the drain sends no events" in caplog.text
        assert events.enabled  # back on for the worker-offline the shutdown sends next
        events.close()


def test_a_stop_run_inside_a_read_of_the_scheduler_still_fires_timers_while_the_pool_drains(
        hub: Hub, caplog: pytest.LogCaptureFixture) -> None:
    """A full run's gpu worker, stopped at "ready": its loop's first read of ``hub.scheduler`` held the
    property's lock, and the drain's timer thread waited on it to the drain's end."""
    pool = _pool_in_hand(fire_with_own_scheduler)
    fired = _release_from_the_drain(hub)
    with caplog.at_level(logging.WARNING), SCHEDULER_LOCK:  # the frame the signal landed in read hub.scheduler
        pool.stop()  # Celery's cold-shutdown handler
    assert fired == ["prefork-timer-shutdown"]
    assert "did not terminate cleanly" not in caplog.text, caplog.text
    assert "fire_timers" not in vars(hub)  # the hub's own method again for the loop


def test_a_stop_run_inside_call_soon_drains_with_timers_and_leaves_the_queue_for_the_loops_close(
        hub: Hub, caplog: pytest.LogCaptureFixture) -> None:
    pool = _pool_in_hand(lambda stop: fire_with_own_scheduler(skip_ready_held_by_the_stop(stop)))
    fired = _release_from_the_drain(hub)
    queued = hub.call_soon(_work_in_hand)  # queued before the stop, as an ack would be
    with caplog.at_level(logging.INFO), hub._ready_lock:  # the frame the signal landed in was queueing
        pool.stop()  # Celery's cold-shutdown handler; the main thread's own run of the queue comes after the join
    assert fired == ["prefork-timer-shutdown"]
    assert "did not terminate cleanly" not in caplog.text, caplog.text
    assert "queued acks run as the loop closes" in caplog.text
    assert queued in hub._pop_ready()  # still queued: the hub's close runs it
    assert "_pop_ready" not in vars(hub)
