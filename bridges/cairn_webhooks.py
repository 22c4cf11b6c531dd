"""The pool's webhook intake inside the Cairn bridge: the CAIRN_WEBHOOKS consumer and the verify responder.

Why in the bridge, like the job consumers: the bridge owns every JetStream
message from arrival to disposition (C1/C2), so a webhook event is held the
same way (``Held``, ``in_progress`` below AckWait, the bridge's in-flight
slots) and its disposition is applied by the same ``settle`` with the same
failure counting and term rule. What an event *means* is decided by
``workers.cairn.webhooks.handle_event`` (which asks the provider's rules),
run in a worker thread on the bridge's own NATS connection: handling an
event is one lookup and one publish, never a provider API call (the fetch
it enqueues is an ordinary ``fetch_source`` job, run by the pool), so it
needs no Celery task, lease or result round trip.

* **Consumer**: one durable per pool, ``<worker_name>__webhook_event``
  (reference §3.14), filtered on ``cairn.webhooks.<worker_key>.event``,
  shared by every instance (CAIRN_WEBHOOKS is a work queue), created or
  updated at start with the job consumers' AckWait and MaxDeliver. Only when
  webhooks are enabled (the provider's verify token is configured): a pool
  without one never holds Strava's events.
* **Verify** on ``cairn.webhooks.<worker_key>.verify``, queue group = pool:
  always answered (503 without a token), so core relays a clear refusal
  instead of its own 3 s timeout.

INTEGRATION: when the ``bridges/cairn/`` package with one admission function
lands, this module's ``_decide`` is the webhook parser/handler to register
there; the consumer definition and the verify responder move unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import ConsumerConfig

from bridges.cairn_ack import FailureCounts, Held, gives_up, settle
from bridges.cairn_pool import JobConsumer, consumer_config
from workers.cairn import subjects
from workers.cairn import webhooks as wh
from workers.cairn.disposition import Disposition, nak
from workers.cairn.handlers.context import Delivery
from workers.cairn.handlers.failure import terminate
from workers.logs import redact

if TYPE_CHECKING:
    from bridges.cairn import CairnBridge

log = logging.getLogger(__name__)

STREAM_WEBHOOKS = subjects.WEBHOOKS_STREAM
FETCH_WAIT_S = 2.0
FETCH_ERROR_BACKOFF_S = 1.0
HANDLER_ERROR_NAK_DELAY_S = 5.0


def webhook_consumer(settings: Any) -> JobConsumer:
    key = subjects.worker_key(settings.worker_name, settings.provider)
    return JobConsumer(wh.KIND, subjects.webhook_event_subject(key), subjects.webhook_durable_name(settings.worker_name))


def webhook_consumer_config(settings: Any) -> ConsumerConfig:
    return consumer_config(webhook_consumer(settings), float(settings.ack_wait_s), int(settings.max_deliver))


class WebhookIntake:
    """Started and stopped by the bridge; holds its messages in the bridge's slots and ``_held``."""

    def __init__(self, bridge: CairnBridge) -> None:
        self.bridge = bridge
        self.settings = bridge.settings
        self.rules = wh.rules_for(self.settings.provider)
        self.consumer = webhook_consumer(self.settings)
        self.enabled = bool(self.rules is not None and self.rules.enabled)
        self._verify_sub: Any = None
        self._loop_task: asyncio.Task[Any] | None = None
        self.failures: FailureCounts | None = None

    async def start(self) -> None:
        if self.rules is None:
            return  # the provider takes no webhooks at all
        b, key = self.bridge, subjects.worker_key(self.settings.worker_name, self.settings.provider)
        self._verify_sub = await b.nc.subscribe(subjects.webhook_verify_subject(key), queue=self.settings.worker_name,
                                                cb=self._on_verify)
        if not self.enabled:
            log.info("webhooks off for pool %s (no verify token): verify answers 503, no consumer",
                     self.settings.worker_name)
            return
        await b.js.add_consumer(STREAM_WEBHOOKS, webhook_consumer_config(self.settings))
        self.failures = FailureCounts(b._aredis, STREAM_WEBHOOKS)
        self._loop_task = asyncio.create_task(self._pull_loop(), name="pull-webhook_event")
        self._loop_task.add_done_callback(b._loop_ended)
        log.info("webhook consumer %s on %s ready", self.consumer.durable, self.consumer.subject)

    async def stop(self) -> None:
        """Stop pulling (the bridge drains what is held) and stop answering verifies."""
        if self._loop_task is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._loop_task), FETCH_WAIT_S + 1.0)
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        if self._verify_sub is not None:
            with contextlib.suppress(Exception):
                await self._verify_sub.unsubscribe()

    # ------------------------------------------------------------------ verify
    async def _on_verify(self, msg: Msg) -> None:
        if msg.reply:
            await msg.respond(wh.verify_response(self.rules, msg.data))

    # ------------------------------------------------------------------ pulling
    async def _bind(self) -> Any:
        try:
            return await self.bridge.js.pull_subscribe_bind(durable=self.consumer.durable, stream=STREAM_WEBHOOKS)
        except Exception as exc:  # noqa: BLE001 - e.g. deleted durable: keep trying, loudly
            log.error("cannot bind %s: %s", self.consumer.durable, type(exc).__name__)
            return None

    async def _pull_loop(self) -> None:
        b = self.bridge
        sub = await self._bind()
        try:
            while not b._stopping.is_set():
                if sub is None:
                    await asyncio.sleep(FETCH_ERROR_BACKOFF_S)
                    sub = await self._bind()
                    continue
                await b._slots.acquire()
                if b._stopping.is_set():
                    b._slots.release()
                    break
                try:
                    msgs = await sub.fetch(1, timeout=FETCH_WAIT_S)
                except (NatsTimeoutError, asyncio.TimeoutError):
                    b._slots.release()
                    continue
                except Exception as exc:  # noqa: BLE001 - back off, bind again
                    b._slots.release()
                    log.warning("fetch on %s failed: %s", self.consumer.subject, redact(str(exc)))
                    await asyncio.sleep(FETCH_ERROR_BACKOFF_S)
                    with contextlib.suppress(Exception):
                        await sub.unsubscribe()
                    sub = await self._bind()
                    continue
                for i, msg in enumerate(msgs):
                    if i:
                        await b._slots.acquire()
                    b.spawn(self._own(msg), name="held-webhook_event")
        finally:
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _own(self, msg: Msg) -> None:
        b = self.bridge
        meta = msg.metadata
        held = Held(self.consumer, msg, int(meta.num_delivered), int(meta.sequence.stream))
        key = -held.seq  # job sequences are positive: webhook sequences never collide with them in ``_held``
        b._held[key] = held
        ticker = asyncio.create_task(b._keep_alive(held))
        try:
            disposition = await self._decide(held)
        except Exception as exc:  # noqa: BLE001 - never leave a message without a disposition
            log.exception("webhook seq %d failed in the bridge: %s", held.seq, redact(str(exc)))
            disposition = nak(HANDLER_ERROR_NAK_DELAY_S, reason="bridge error")
        try:
            assert self.failures is not None
            await settle(held, disposition, self.failures, self.settings.term_after_deliveries)
        finally:
            ticker.cancel()
            b._held.pop(key, None)
            b._slots.release()

    async def _decide(self, held: Held) -> Disposition:
        """The same rules as a job: a persistently failing event is termed with its envelope."""
        assert self.failures is not None
        delivery = Delivery(attempt=held.delivery, stream_seq=held.seq, subject=held.msg.subject)
        ctx = self.bridge.envelope_ctx
        if self.bridge._stopping.is_set():
            return nak(reason="bridge shutting down", failure=False)
        held.failures = await self.failures.count(held)
        if gives_up(held.failures, self.settings.term_after_deliveries):
            ref = {"job_id": f"{STREAM_WEBHOOKS}-{held.seq}"}
            return await asyncio.to_thread(
                terminate, ctx, wh.FAILURE_KIND, ref, delivery, code="max_deliveries",
                message=f"webhook failed on {held.failures} of {held.delivery} deliveries; giving up",
                error_class="ERROR_CLASS_TRANSIENT")
        return await asyncio.to_thread(wh.handle_event, ctx, held.msg.data, delivery, rules=self.rules)
