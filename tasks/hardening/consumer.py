"""The workers' consumer: task events go out in batches, at most ``EVENT_FLUSH_INTERVAL_S`` late.

Flower builds its task list from task events (``task-received``, ``-started``,
``-succeeded``: three per job). Celery's consumer already buffers them and sends
a buffer as one ``task.multi`` message, but it flushes on the next turn of its
event loop, so under load nearly every event went out alone: a kombu publish and
a Redis ``PUBLISH`` each, about a third of a provider worker's main process
(issue 15 §3). Here the first buffered event schedules one flush
``EVENT_FLUSH_INTERVAL_S`` later and every event until then rides along: a busy
worker sends a few messages a second whatever its job rate, Flower shows a task
at most that much later, and nothing is dropped (a buffer that fills up is still
flushed at once, and what is buffered goes out before the consumer stops).

``tasks.settings`` selects it with ``worker_consumer`` for every worker (io,
gpu, provider).
"""

from __future__ import annotations

import contextlib
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

EVENT_FLUSH_INTERVAL_S = 0.1  # how late a task event may reach Flower; a tenth of a second is not seen


class Consumer(CeleryConsumer):
    """Celery's consumer with task events flushed on a short timer instead of every loop turn."""

    _event_flush_scheduled = False

    def on_send_event_buffered(self) -> None:
        if self.hub is None:
            super().on_send_event_buffered()
            return
        if not self._event_flush_scheduled:
            self._event_flush_scheduled = True
            self.hub.call_later(EVENT_FLUSH_INTERVAL_S, self._flush_batched_events)

    def _flush_batched_events(self) -> None:
        self._event_flush_scheduled = False
        self._flush_events()

    def stop(self) -> None:
        self._flush_pending_events()
        super().stop()

    def shutdown(self) -> None:
        self._flush_pending_events()
        super().shutdown()

    def _flush_pending_events(self) -> None:
        """What the timer has not sent yet goes out now (the broker may already be gone: then it is lost,
        as with Celery's own buffer)."""
        with contextlib.suppress(Exception):
            self._flush_events()


CONSUMER = f"{__name__}:{Consumer.__qualname__}"


def install(app: Any) -> None:
    """Every worker of ``app`` (io, gpu, provider) runs this consumer."""
    app.conf.worker_consumer = CONSUMER


__all__ = ["CONSUMER", "Consumer", "EVENT_FLUSH_INTERVAL_S", "install"]
