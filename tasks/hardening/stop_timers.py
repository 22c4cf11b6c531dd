"""A pool stopped from inside a signal handler keeps firing the event loop's timers while it drains."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from celery import bootsteps
from celery.concurrency.prefork import TaskPool as PreforkPool
from kombu.asynchronous import get_event_loop

log = logging.getLogger(__name__)


class _OwnScheduler:
    """What ``Hub.fire_timers`` reads of its hub: the timer queue, and a scheduler of the drain's own."""

    def __init__(self, timer: Any) -> None:
        self.timer = timer
        self.scheduler = iter(timer)


def fire_with_own_scheduler(stop: Callable[[], None]) -> Callable[[], None]:
    """A pool's ``on_stop`` whose drain thread fires timers without reading the hub's scheduler.

    Celery 5.7's prefork ``on_stop`` fires the hub's timers from a thread while the pool joins
    (``hub.fire_timers`` steps the generator ``hub.scheduler``). Its cold shutdown
    (``REMAP_SIGTERM=SIGQUIT``, the Procfile's workers) stops the pool inside the signal handler,
    on the main thread, wherever the signal landed. Two places stalled the drain: inside that
    generator (every pass raised ``ValueError: generator already executing``), and inside a read
    of ``hub.scheduler``, a kombu ``cached_property`` that takes a lock on every read: the
    interrupted frame held it until the handler returned, the thread waited the drain out, and
    Celery warned its timer thread "did not terminate cleanly" (a gpu worker stopped at "ready",
    as its loop first read the scheduler). Here the drain steps a scheduler of its own over the
    same timer queue; the interrupted frame goes on with the hub's once the handler returns.
    """
    def on_stop() -> None:
        hub: Any = get_event_loop()
        if hub is None:
            stop()
            return
        hub.fire_timers = functools.partial(type(hub).fire_timers, _OwnScheduler(hub.timer))
        try:
            stop()
        finally:
            vars(hub).pop("fire_timers", None)  # the class's method again (the loop holds its own reference)

    return on_stop


def _nothing_ready() -> set[Any]:
    return set()


def skip_ready_held_by_the_stop(stop: Callable[[], None]) -> Callable[[], None]:
    """A prefork pool's ``on_stop`` that leaves the hub's ready queue alone if the stop's own frame holds it.

    The drain thread runs the acks queued with ``hub.call_soon`` on every pass, taking the queue's
    lock. In a prefork main process the loop's thread is the one that queues, so a lock held when
    the stop begins is held by the frame the signal interrupted (inside ``call_soon``) until the
    handler returns: the thread waited the drain out, as in :func:`fire_with_own_scheduler`. The
    queue is left alone instead, by the drain and by the main thread's run of it after the join
    (the lock is not re-entrant: that run would wait on its own frame for ever); the hub runs what
    is queued when it closes, after the handler has returned.
    """
    def on_stop() -> None:
        hub: Any = get_event_loop()
        lock = getattr(hub, "_ready_lock", None)
        if lock is None or not lock.locked():
            stop()
            return
        log.info("Stop signal while the loop queued a callback: queued acks run as the loop closes")
        hub._pop_ready = _nothing_ready
        try:
            stop()
        finally:
            vars(hub).pop("_pop_ready", None)

    return on_stop


def skip_events_held_by_the_stop(stop: Callable[[], None], dispatcher: Callable[[], Any]) -> Callable[[], None]:
    """A prefork pool's ``on_stop`` whose drain thread skips the events the stop's own frame blocks.

    The drain thread fires the event heartbeat, which publishes under the event dispatcher's
    lock. In a prefork main process only the main thread publishes (a task's ``received``,
    ``started`` and ``succeeded``), so a lock held when the stop begins is held by the frame the
    signal interrupted, and is only released once the stop has returned: a heartbeat due in the
    drain waited on it to the drain's end, no timer fired after it, and Celery warned that its
    timer thread "did not terminate cleanly". Events are off for the drain in that case only
    (the interrupted publish is past that check and ends as ever); the worker is stopping anyway.
    """
    def on_stop() -> None:
        events = dispatcher()
        mutex = getattr(events, "mutex", None)
        if not getattr(events, "enabled", False) or mutex is None or not mutex.locked():
            stop()
            return
        log.info("Stop signal during an event publish: the drain sends no events until it ends")
        events.enabled = False
        try:
            stop()
        finally:
            events.enabled = True

    return on_stop


class DrainTimers(bootsteps.Step):
    """Worker bootstep, once the pool exists: its ``on_stop`` is wrapped by :func:`fire_with_own_scheduler`,
    and a prefork pool's by :func:`skip_events_held_by_the_stop` and :func:`skip_ready_held_by_the_stop` too."""

    requires = ("celery.worker.components:Pool",)

    def create(self, parent: Any) -> None:
        pool = getattr(parent, "pool", None)
        if pool is None:
            return
        on_stop = pool.on_stop
        if isinstance(pool, PreforkPool):
            on_stop = skip_ready_held_by_the_stop(skip_events_held_by_the_stop(
                on_stop, lambda: getattr(getattr(parent, "consumer", None), "event_dispatcher", None)))
        pool.on_stop = fire_with_own_scheduler(on_stop)


def install(app: Any) -> None:
    """Add the bootstep to ``app``'s workers."""
    app.steps["worker"].add(DrainTimers)
