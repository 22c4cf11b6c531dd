"""Discover (§8) and OAuth code exchange (§9b) responders, answered through the provider pool.

Both are plain core-NATS request/reply subjects of the pool. We subscribe in a
queue group so several bridge instances share the requests (the published
Strava worker answers on every instance and spends API budget on each).
The provider call itself runs in the pool (``cairn.discover`` /
``cairn.exchange`` tasks), so it shares the rate limiter and HTTP client of
the job tasks, under a deadline: on a missed deadline or a failed task we
reply the contract's error shape, never an empty success (§8: the UI would
show "0 importable activities").

The exchange request carries ``client_secret`` and ``code``: it is parked in
Redis under a random key with a short TTL and only the key travels as a task
argument; the task parks the token reply the same way and returns
``{"reply_key": ...}``. Nothing secret reaches Flower, the result backend or a log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import TYPE_CHECKING, Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bridges import cairn_glue as glue

if TYPE_CHECKING:
    from bridges.cairn import CairnBridge

log = logging.getLogger(__name__)

# Deadlines come from CAIRN_DISCOVER_DEADLINE_S (core waits 90 s) and CAIRN_EXCHANGE_DEADLINE_S
# (contract §9b: answer within 20 s). A parked secret outlives its deadline only by this much:
PARK_MARGIN_S = 5.0


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


class Responders:
    """The pool's request/reply subscriptions, bound to one bridge."""

    def __init__(self, bridge: CairnBridge, nc: NATS) -> None:
        self.bridge, self.nc = bridge, nc
        self._subs: list[Subscription] = []
        self.queue_group = glue.queue_group(bridge.settings)

    async def start(self) -> None:
        s = self.bridge.settings
        discover = glue.discover_subject(s)
        self._subs.append(await self.nc.subscribe(discover, queue=self.queue_group, cb=self._on_discover))
        log.info("discover responder on %s (queue group %s)", discover, self.queue_group)
        if glue.links_oauth_accounts(self.bridge.provider):
            exchange = glue.exchange_subject(s)
            self._subs.append(await self.nc.subscribe(exchange, queue=self.queue_group,
                                                      cb=self._on_exchange))
            log.info("oauth exchange responder on %s", exchange)

    async def stop(self) -> None:
        for sub in self._subs:
            try:
                await sub.drain()
            except Exception as exc:  # noqa: BLE001 - closing anyway
                log.debug("drain of %s failed: %s", sub.subject, type(exc).__name__)
        self._subs.clear()

    # nats-py runs one subscription's callbacks one after another: spawn, so a
    # slow pool answer never blocks the next request.
    async def _on_discover(self, msg: Msg) -> None:
        self.bridge.spawn(self._discover(msg), name="discover")

    async def _on_exchange(self, msg: Msg) -> None:
        self.bridge.spawn(self._exchange(msg), name="exchange")

    async def _reply(self, msg: Msg, body: dict[str, Any]) -> None:
        if msg.reply:
            await msg.respond(_encode(body))

    async def _call(self, task_name: str, args: list[Any], deadline_s: float) -> dict[str, Any] | None:
        """Run one pool task and return its result dict, or None on deadline/failure."""
        task_id = f"{task_name}-{uuid.uuid4().hex}"
        results = self.bridge.results
        watch = await results.watch(task_id)
        try:
            await asyncio.to_thread(self.bridge.app.send_task, task_name, args=args, task_id=task_id,
                                    expires=deadline_s)
            try:
                meta = await asyncio.wait_for(asyncio.shield(watch.done), timeout=deadline_s)
            except asyncio.TimeoutError:
                log.warning("%s missed its %.0fs deadline", task_name, deadline_s)
                return None
        finally:
            await results.forget(watch)
        if meta.get("status") != "SUCCESS" or not isinstance(meta.get("result"), dict):
            log.warning("%s failed in the pool (%s)", task_name, meta.get("status"))
            return None
        return meta["result"]

    async def _discover(self, msg: Msg) -> None:
        from tasks.cairn import DISCOVER_TASK

        try:
            request = json.loads(msg.data or b"{}")
            if not isinstance(request, dict):
                raise ValueError("not an object")
            body = {"account_id": str(request.get("account_id") or ""),
                    "start_page": int(request.get("start_page") or 1)}
        except (ValueError, TypeError):
            await self._reply(msg, {"error": "bad_request"})
            return
        reply = await self._call(DISCOVER_TASK, [body], self.bridge.settings.discover_deadline_s)
        if reply is None or not glue.valid_discover_reply(reply):
            reply = {"error": "discover did not complete in the provider pool; try again"}
        await self._reply(msg, reply)

    async def _exchange(self, msg: Msg) -> None:
        from tasks.cairn import EXCHANGE_TASK

        try:
            request = json.loads(msg.data or b"{}")
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except ValueError:
            await self._reply(msg, {"error": "bad_request", "message": "request is not a JSON object"})
            return
        sealed = self.bridge.sealed_store
        deadline_s = self.bridge.settings.exchange_deadline_s
        key = await asyncio.to_thread(sealed.park, request, deadline_s + PARK_MARGIN_S)
        del request
        result = await self._call(EXCHANGE_TASK, [key], deadline_s)
        reply: Any = None
        if result is not None and result.get("reply_key"):
            reply = await asyncio.to_thread(sealed.unpark, str(result["reply_key"]))
        if not isinstance(reply, dict):
            await asyncio.to_thread(sealed.discard, key)  # drop the secret if nobody took it
            reply = {"error": "transient", "message": "the code exchange did not complete in time; retry"}
        await self._reply(msg, reply)
