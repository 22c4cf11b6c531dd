"""A stopping worker's soft-shutdown window ends as soon as its work in hand has ended."""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Iterable
from types import MethodType
from typing import Any

from celery import bootsteps
from celery.worker import state

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05  # how often the window looks whether a task in hand has ended


def _children(worker: Any) -> dict[int, Any] | None:
    """The prefork pool's child processes by pid, or None for a pool without result pipes."""
    processes = getattr(getattr(getattr(worker, "pool", None), "_pool", None), "_pool", None)
    if processes is None:
        return None
    return {proc.pid: proc for proc in processes if getattr(proc, "outqR_fd", None) is not None}


def _ended(request: Any, children: dict[int, Any]) -> bool:
    """Whether the child running ``request`` has answered (its result) or is gone.

    The child already told the main process it accepted the job (that is what made the request
    active), so the next thing it writes to its result pipe is that job's outcome, stored in the
    result backend before it is written. The pipe is only looked at, never read: the event loop
    reads it as ever if it runs again."""
    proc = children.get(request.worker_pid)
    if proc is None:
        return True
    try:
        readable, _, _ = select.select([proc.outqR_fd], [], [], 0)
    except (OSError, ValueError):  # the pipe is closed: the child is gone
        return True
    return bool(readable)


def wait_for_work_in_hand(worker: Any) -> None:
    """Celery's soft shutdown (``worker_soft_shutdown_timeout``), ending when no task is left running.

    Celery sleeps the whole window inside the stop signal's handler whenever a task is active, so
    the event loop, which would learn that the task ended, does not run meanwhile: a worker whose
    transcription ended 0.8 s after SIGTERM still exited after the full 10 s. Here the handler
    watches each active task's child instead. A task that ended is marked ready, so Celery's cancel
    after the window does not terminate its idle child or record a retry over its outcome; a task
    still running at the window's end is cancelled and handed back by Celery as before.

    A pool without result pipes (``-P threads``, the Procfile's ``garmin`` line) runs each task's
    outcome callback on the pool's own thread, which marks the task ready itself while this handler
    waits: the window ends when no task it began with is still active."""
    timeout_s = float(worker.app.conf.worker_soft_shutdown_timeout or 0)
    pending = list(state.active_requests)
    if timeout_s <= 0 or not pending:
        return
    children = _children(worker)
    started = time.monotonic()
    deadline = started + timeout_s
    log.info("Soft shutdown: waiting up to %.1f s for %d task(s) in hand", timeout_s, len(pending))
    while True:
        pending = [request for request in pending if request in state.active_requests]
        if children is not None:
            pending = _mark_ended(pending, children)
        now = time.monotonic()
        if not pending or now >= deadline:
            break
        time.sleep(min(DRAIN_POLL_S, deadline - now))
    waited_s = time.monotonic() - started
    if pending:
        log.info("Soft shutdown: window over after %.1f s with %d task(s) still running", waited_s, len(pending))
    else:
        log.info("Soft shutdown: work in hand ended after %.1f s", waited_s)


def _mark_ended(requests: Iterable[Any], children: dict[int, Any]) -> list[Any]:
    """The requests still running; each one that ended is marked ready (no longer active)."""
    running = []
    for request in requests:
        if _ended(request, children):
            state.task_ready(request)
        else:
            running.append(request)
    return running


class QuickDrain(bootsteps.StartStopStep):
    """Worker bootstep: the worker's soft-shutdown wait is :func:`wait_for_work_in_hand`."""

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        parent.wait_for_soft_shutdown = MethodType(wait_for_work_in_hand, parent)


def install(app: Any) -> None:
    """Add the bootstep to ``app``'s workers."""
    app.steps["worker"].add(QuickDrain)
