"""A pool stopped from inside a signal handler keeps firing the event loop's timers while it drains."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import bootsteps
from kombu.asynchronous import get_event_loop


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


class DrainTimers(bootsteps.Step):
    """Worker bootstep, once the pool exists: its ``on_stop`` is wrapped by :func:`fire_with_own_scheduler`."""

    requires = ("celery.worker.components:Pool",)

    def create(self, parent: Any) -> None:
        pool = getattr(parent, "pool", None)
        if pool is not None:
            pool.on_stop = fire_with_own_scheduler(pool.on_stop)


def install(app: Any) -> None:
    """Add the bootstep to ``app``'s workers."""
    app.steps["worker"].add(DrainTimers)
