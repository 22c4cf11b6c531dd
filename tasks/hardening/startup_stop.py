"""A stop signal while a worker starts stops it cleanly: no CRITICAL line, no traceback, exit 0."""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

from celery import bootsteps, signals
from celery.platforms import EX_FAILURE
from celery.worker import state

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)  # each is a cold shutdown in the Procfile
COLD = "Cold"


def stopping() -> bool:
    """Whether this worker was told to stop (warm or cold): it must not start anything more.

    Read as Celery's ``state.maybe_shutdown`` reads the flags: a flag holds the exit code, and a warm
    stop's is ``EX_OK``, 0, which is falsy but a stop all the same.
    """
    return any(flag is not None and flag is not False for flag in (state.should_terminate, state.should_stop))


class StopWhileStarting(bootsteps.StartStopStep):
    """Worker bootstep, right after the event loop's hub exists and before the pool starts.

    Under ``REMAP_SIGTERM=SIGQUIT`` Celery's cold-shutdown handler stops the prefork pool on the spot;
    arriving between the pool's start and the event loop, it left the consumer to start on a stopped
    pool and the worker ended with ``Unrecoverable error`` and exit 1. Until the loop runs, a stop
    signal here does what the cold shutdown does except stopping the pool inside the handler: it sets
    the cold-shutdown flag, which Celery checks while it connects, starts its consumer and at the top
    of its loop, and then terminates the worker, pool included. Nothing was consumed yet.
    """

    requires = ("celery.worker.components:Hub",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._celery_handlers: dict[int, Any] = {}

    def start(self, parent: Any) -> None:
        # No hub (another pool or transport): the loop is not the one this guards. Handlers are
        # the main thread's only (an embedded worker runs elsewhere).
        if parent.hub is None or threading.current_thread() is not threading.main_thread():
            return
        self._celery_handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        handler = _flag_cold_shutdown(parent)
        for sig in STOP_SIGNALS:
            signal.signal(sig, handler)
        parent.hub.call_soon(self._give_back)  # runs in the loop's first pass: the consumer has started

    def _give_back(self) -> None:
        """Celery's own handlers again, unless a stop already came (the worker is terminating)."""
        if not stopping():
            for sig, handler in self._celery_handlers.items():
                signal.signal(sig, handler)
        self._celery_handlers = {}


def _flag_cold_shutdown(worker: Any) -> Any:
    main_pid = os.getpid()

    def handler(signum: int, _frame: FrameType | None) -> None:
        # A pool child forked meanwhile runs this until its initializer resets its signals: the stop is
        # the main process's to make (a child ignores SIGTERM once initialized, and goes with the pool).
        if os.getpid() != main_pid or stopping():  # or a second signal while the first one's stop runs
            return
        name = signal.Signals(signum).name
        print(f"worker: {COLD} shutdown while starting ({name}, MainProcess)", file=sys.__stdout__, flush=True)
        try:
            signals.worker_shutting_down.send(sender=worker.hostname, sig=name, how=COLD, exitcode=EX_FAILURE)
        finally:
            state.should_terminate = EX_FAILURE  # whatever a receiver did: Celery stops at its next check
            _expect_children_stopped(worker)

    return handler


def _expect_children_stopped(worker: Any) -> None:
    """A stop sent to the worker's group (as honcho and the dyno manager send it) reaches the pool's
    children too, and a child still initialising takes SIGTERM's default action (an initialised one
    ignores it under the Procfile's ``REMAP_SIGTERM``). One killed before the event
    loop's first check of the pool (``did_start_ok``, just after the "ready" line) failed that check:
    ``Process 'ForkPoolWorker-1' exited with 'signal 15'``, ``Unrecoverable error: WorkerLostError``
    and exit 1 (a quiet full run, stopped at "ready"). Once the stop is flagged, the worker is ending
    anyway: the check passes, and Celery's cold shutdown terminates the pool as after any stop.

    Each child is also marked as ending under control (billiard's own mark for a child it
    terminates): found gone in the loop's first pass, it is reaped without that ERROR line."""
    pool = getattr(worker, "pool", None)
    if pool is not None:
        pool.did_start_ok = _stopping_anyway
        for child in getattr(getattr(pool, "_pool", None), "_pool", ()):  # billiard's processes, if started
            child._controlled_termination = True


def _stopping_anyway() -> bool:
    return True


def install(app: Any) -> None:
    """Add the bootstep to ``app``'s workers."""
    app.steps["worker"].add(StopWhileStarting)
