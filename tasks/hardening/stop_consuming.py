"""A worker told to stop consumes nothing more: its task channel answers "no credit" from then on.

Why: Celery's cold shutdown (SIGTERM under the Procfile's ``REMAP_SIGTERM=SIGQUIT``, SIGQUIT, a second
SIGINT) stops the prefork pool *inside the signal handler*, and a Python handler runs wherever the
main thread is. Caught mid-turn of the event loop (in a timer's Redis round trip: likely on a loaded
box, certain while Redis does not answer), the handler returns into the rest of that turn, whose
next step asks kombu's Redis poller whether the task channel may consume. With
``worker_disable_prefetch`` (tasks/settings.py) Celery answers from the pool's size, and the stopped
pool has none: ``Unrecoverable error: AttributeError("'NoneType' object has no attribute
'_processes'")``, a traceback and exit 1 instead of a clean stop (issue 14's full-suite run;
``tests/fleet/test_procfile.py``, a worker stopped while its main thread waits on a frozen Redis).

So once the worker is stopping, the channel has no credit, before Celery's check is asked. That is
what a stop means anyway (Celery has cancelled the task consumer by then): kombu leaves a BRPOP
already sent unread, and closing the channel reads its reply and requeues a message it carried, so
nothing popped is lost. The turn ends, the loop sees the stop, and Celery terminates as after any
cold shutdown. The wrapper goes on every channel the consumer opens (after each reconnect).
"""

from __future__ import annotations

from types import MethodType
from typing import Any

from celery import bootsteps

from tasks.hardening.startup_stop import stopping

CELERY_TASKS_STEP = "celery.worker.consumer.tasks:Tasks"  # opens the task channel, adds Celery's limit


class NoCreditWhileStopping(bootsteps.StartStopStep):
    """Consumer bootstep, right after Celery's task consumer (and its prefetch limit) starts."""

    requires = (CELERY_TASKS_STEP,)

    def start(self, c: Any) -> None:
        qos = getattr(getattr(c.task_consumer, "channel", None), "qos", None)
        celery_can_consume = getattr(qos, "can_consume", None)
        if celery_can_consume is None:  # a transport without kombu's virtual QoS: no such check
            return

        def can_consume(_qos: Any) -> bool:
            return not stopping() and bool(celery_can_consume())

        qos.can_consume = MethodType(can_consume, qos)


def install(app: Any) -> None:
    """Add the bootstep to ``app``'s worker consumers."""
    app.steps["consumer"].add(NoCreditWhileStopping)
