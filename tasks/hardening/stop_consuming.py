"""A worker told to stop consumes nothing more: its task channel answers "no credit" from then on."""

from __future__ import annotations

from collections.abc import Callable
from types import MethodType
from typing import Any

from celery import bootsteps

from tasks.hardening.startup_stop import stopping

CELERY_TASKS_STEP = "celery.worker.consumer.tasks:Tasks"  # opens the task channel, adds Celery's limit


class NoCreditWhileStopping(bootsteps.StartStopStep):
    """Consumer bootstep, right after Celery's task consumer (and its prefetch limit) starts.

    Celery's cold shutdown stops the prefork pool inside the signal handler, which returns into the
    rest of the event loop's turn; its next step asks whether the task channel may consume, and with
    ``worker_disable_prefetch`` Celery answers from the stopped pool's size (an ``AttributeError``,
    exit 1). Once the worker is stopping, the channel has no credit before Celery is asked, on every
    channel the consumer opens; a BRPOP already sent is handled by ``tasks.hardening.last_pop``.
    The stop may also land inside Celery's answer, after the first check: see :func:`no_credit_while_stopping`.
    """

    requires = (CELERY_TASKS_STEP,)

    def start(self, c: Any) -> None:
        qos: Any = getattr(getattr(c.task_consumer, "channel", None), "qos", None)
        celery_can_consume = getattr(qos, "can_consume", None)
        if celery_can_consume is None:  # a transport without kombu's virtual QoS: no such check
            return

        def can_consume(_qos: Any) -> bool:
            return no_credit_while_stopping(celery_can_consume)

        qos.can_consume = MethodType(can_consume, qos)


def no_credit_while_stopping(celery_can_consume: Callable[[], object]) -> bool:
    """Celery's answer to "may the task channel consume?", and no whenever the worker is stopping.

    Python runs a signal handler at the main thread's next call, which may be inside Celery's answer,
    after the first check: the cold shutdown then stops the pool that Celery is about to read
    (the same ``AttributeError`` on ``_processes``; a full run, a gpu worker stopped at "ready"),
    or it stops after Celery said yes. So stopping is checked again after the answer, and an
    ``AttributeError`` is the stopped pool only if the worker is stopping by then.
    """
    if stopping():
        return False
    try:
        allowed = bool(celery_can_consume())
    except AttributeError:
        if stopping():
            return False
        raise
    return allowed and not stopping()


def install(app: Any) -> None:
    """Add the bootstep to ``app``'s worker consumers."""
    app.steps["consumer"].add(NoCreditWhileStopping)
