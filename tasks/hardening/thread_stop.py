"""A threads pool stopped from inside a signal handler never waits on the hand-off the signal interrupted."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from celery import bootsteps
from celery.concurrency.thread import TaskPool as ThreadTaskPool
from celery.utils import log as celery_log

log = logging.getLogger(__name__)


class HandOff:
    """Whether the main thread is handing a task to the pool's executor right now (``submit``): ``idle``
    is clear for as long as it does, so a deferred stop awaits the hand-off's end instead of polling."""

    def __init__(self) -> None:
        self.idle = threading.Event()
        self.idle.set()

    def wrap(self, apply: Callable[..., Any]) -> Callable[..., Any]:
        def on_apply(*args: Any, **kwargs: Any) -> Any:
            self.idle.clear()
            try:
                return apply(*args, **kwargs)
            finally:
                self.idle.set()

        return on_apply


def signal_safe_stop(stop: Callable[[], None], handoff: HandOff) -> Callable[[], None]:
    """A threads pool's ``on_stop`` that returns at once when the stop signal landed inside a hand-off.

    Celery's cold shutdown (``REMAP_SIGTERM=SIGQUIT``, the Procfile's ``garmin`` line) stops the pool
    inside the signal handler, on the main thread. ``ThreadPoolExecutor.shutdown`` takes the
    executor's lock, which ``submit`` holds while it starts a thread: a signal landing there made the
    handler wait on its own interrupted frame, and the worker hung until SIGKILL. The stop then runs
    on a thread of its own once the hand-off has returned, with the same effect: no new task starts,
    tasks not yet begun are cancelled, the running ones end.
    """
    def on_stop() -> None:
        if handoff.idle.is_set():
            stop()
            return

        def stop_after_handoff() -> None:
            handoff.idle.wait()
            stop()

        log.info("Stop signal during a task's hand-off to the thread pool: the pool stops once it returns")
        threading.Thread(target=stop_after_handoff, name="thread-pool-stop", daemon=True).start()

    return on_stop


def leave_running_task(terminate_job: Callable[..., None]) -> Callable[..., None]:
    """A threads pool's ``terminate_job`` that, in a stop's signal handler, leaves a running task to end by itself.

    Celery's cold shutdown cancels the tasks still running once the soft-shutdown window is over,
    through the pool's ``terminate_job``, which a threads pool lacks: ``Unrecoverable error:
    NotImplementedError(... does not implement kill_job)``, a traceback and exit 1 (a ``garmin``
    worker stopped while Garmin held a request, in a full run). A thread cannot be killed, so the
    cancel goes on as for any pool: the task is announced cancelled and its unacked message goes
    back to its queue as the worker's channel closes, while the thread runs to its own end, which
    its HTTP timeouts bound, and the process exits after it. Outside a signal handler (``revoke
    --terminate``, Flower's Terminate) Celery's own refusal stands: the task would otherwise be
    recorded as terminated while it runs on.
    """
    def terminate(pid: int, signal: object = None) -> None:
        if not celery_log._in_sighandler:  # set by Celery's stop handlers (``in_sighandler``) while they run
            terminate_job(pid, signal)
            return
        log.warning("Cold shutdown: a task still running in a thread cannot be killed; it ends by itself "
                    "and its message goes back to the queue")

    return terminate


class SignalSafeThreadStop(bootsteps.Step):
    """Worker bootstep, once the pool exists: a threads pool's hand-offs are tracked, its ``on_stop`` is
    :func:`signal_safe_stop` and its ``terminate_job`` :func:`leave_running_task`."""

    requires = ("celery.worker.components:Pool",)

    def create(self, parent: Any) -> None:
        pool = getattr(parent, "pool", None)
        if isinstance(pool, ThreadTaskPool):
            make_signal_safe(pool)


def make_signal_safe(pool: ThreadTaskPool) -> None:
    """Track ``pool``'s hand-offs, make its ``on_stop`` :func:`signal_safe_stop` and its ``terminate_job``
    :func:`leave_running_task`."""
    handoff = HandOff()
    pool.on_apply = handoff.wrap(pool.on_apply)
    pool.on_stop = signal_safe_stop(pool.on_stop, handoff)
    pool.terminate_job = leave_running_task(pool.terminate_job)


def install(app: Any) -> None:
    """Add the bootstep to ``app``'s workers."""
    app.steps["worker"].add(SignalSafeThreadStop)
