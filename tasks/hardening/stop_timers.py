"""A pool stopped from inside a signal handler keeps firing the event loop's timers while it drains."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import bootsteps
from celery.concurrency.prefork import TaskPool as PreforkPool
from kombu.asynchronous import get_event_loop

log = logging.getLogger(__name__)


def fire_with_own_scheduler(stop: Callable[[], None]) -> Callable[[], None]:
    """A pool's ``on_stop`` whose drain thread never steps a scheduler the stop's own frame interrupted.

    Celery 5.7's prefork ``on_stop`` fires the hub's timers from a thread while the pool joins
    (``hub.fire_timers`` steps the generator ``hub.scheduler``). Its cold shutdown
    (``REMAP_SIGTERM=SIGQUIT``, the Procfile's workers) stops the pool inside the signal handler,
    on the main thread, wherever the signal landed. Landing inside that generator, every pass of
    the thread raised ``ValueError: generator already executing``: a WARNING with a traceback
    each half second, and no timer fired for the whole drain. Here the thread steps a scheduler
    of its own over the same timer queue (the interrupted frame cannot run until the handler
    returns), and the hub's is put back afterwards for that frame to finish.
    """
    def on_stop() -> None:
        hub = get_event_loop()
        interrupted = getattr(hub, "scheduler", None)
        if hub is None or not getattr(interrupted, "gi_running", False):
            stop()
            return
        hub.scheduler = iter(hub.timer)
        try:
            stop()
        finally:
            hub.scheduler = interrupted

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
    and a prefork pool's by :func:`skip_events_held_by_the_stop` too."""

    requires = ("celery.worker.components:Pool",)

    def create(self, parent: Any) -> None:
        pool = getattr(parent, "pool", None)
        if pool is None:
            return
        on_stop = pool.on_stop
        if isinstance(pool, PreforkPool):
            on_stop = skip_events_held_by_the_stop(
                on_stop, lambda: getattr(getattr(parent, "consumer", None), "event_dispatcher", None))
        pool.on_stop = fire_with_own_scheduler(on_stop)


def install(app: Any) -> None:
    """Add the bootstep to ``app``'s workers."""
    app.steps["worker"].add(DrainTimers)
