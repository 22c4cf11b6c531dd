"""The workers' consumer: task events go out in batches, at most ``EVENT_FLUSH_INTERVAL_S`` late."""

from __future__ import annotations

import contextlib
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

from tasks.hardening.reconnect import CappedReconnect

EVENT_FLUSH_INTERVAL_S = 0.1  # how late a task event may reach Flower; a tenth of a second is not seen


class Consumer(CappedReconnect, CeleryConsumer):
    """Celery's consumer with task events flushed on a short timer instead of every loop turn, and its
    broker reconnect's waits capped (:class:`~tasks.hardening.reconnect.CappedReconnect`).

    Flower lists tasks from their events, three per job. Celery buffers them but flushes on the
    next loop turn, so under load nearly each went out alone as its own publish. Here the first
    buffered event schedules one flush and every event until then rides along; a full buffer is
    still flushed at once and what is buffered goes out before the consumer stops.
    """

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
