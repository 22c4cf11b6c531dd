"""Failure envelopes (contract §6) the bridge publishes itself before terming a message."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from bridges.cairn.admission import DeliveryMeta, Envelope
from workers.cairn.handlers.context import Delivery, JobContext
from workers.cairn.handlers.failure import publish_failure
from workers.cairn.refusals import PermissionRefused, Refusals
from workers.providers.base import Provider

log = logging.getLogger(__name__)


class LoopNats:
    """What a ``JobContext`` needs of a ``NatsThread`` (``run``, ``nc``, ``js``, ``refusals``), on the
    bridge's loop; ``refusals`` are the bridge connection's (``workers.cairn.refusals``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, nc: Any, js: Any, refusals: Refusals | None = None) -> None:
        self._loop, self.nc, self.js = loop, nc, js
        self.refusals = refusals

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)


class Envelopes:
    """Publishes the envelope of a message the bridge terms.

    Reuses the handlers' code unchanged (``failure.publish_failure``: same subject, stamp and
    ``failed:<p>:<ext|job>:d<n>`` msg-id); it is sync, so it runs in a worker thread and hands its
    coroutines back to the bridge's loop through :class:`LoopNats`.

    ``publish`` is True when the term may go ahead: core's stream has the envelope, or NATS
    *refuses* its subject, which no retry changes (the connection reported the refusal once,
    loudly, and recorded it as a fault; a NAK would loop for ever). False: try again later.
    """

    def __init__(self, settings: Any, provider: Provider, nats: LoopNats) -> None:
        self._ctx = JobContext(settings=settings, nats=nats, redis=None, provider=provider,
                               http=None, blob_http=None)  # type: ignore[arg-type]

    def _publish(self, meta: DeliveryMeta, envelope: Envelope) -> None:
        delivery = Delivery(attempt=meta.delivered, stream_seq=meta.seq, subject=meta.subject)
        publish_failure(self._ctx, meta.kind, envelope.ref, delivery, code=envelope.code,
                        message=envelope.message, error_class=envelope.error_class)

    async def publish(self, meta: DeliveryMeta, envelope: Envelope) -> bool:
        try:
            await asyncio.to_thread(self._publish, meta, envelope)
        except PermissionRefused as exc:
            log.info("%s seq %d: termed without its failure envelope: %s", meta.kind, meta.seq, exc)
            return True
        except Exception as exc:  # noqa: BLE001 - no envelope, no term: the caller NAKs
            log.warning("%s failure envelope for seq %d not published: %s", meta.kind, meta.seq,
                        type(exc).__name__)
            return False
        return True
