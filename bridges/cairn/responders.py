"""Discover (§8) and OAuth code exchange (§9b) responders, answered through the provider pool."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bridges.cairn.results import TaskResults
from workers.cairn import sealed
from workers.cairn.handlers.discover import valid_discover_reply

log = logging.getLogger(__name__)

# A parked secret outlives its deadline only by this much (deadlines: CAIRN_DISCOVER_DEADLINE_S,
# core waits 90 s; CAIRN_EXCHANGE_DEADLINE_S, contract §9b: answer within 20 s).
PARK_MARGIN_S = 5.0
MAX_REQUEST_BYTES = 64 * 1024  # both requests are a few hundred bytes; anything larger is malformed
MAX_FIELD_CHARS = 4096  # an id, a code, a URL: longer is not a real request
MAX_START_PAGE = 1_000_000
EXCHANGE_STRING_FIELDS = ("connection_id", "client_id", "client_secret", "code", "redirect_uri", "code_verifier")
EXCHANGE_REQUIRED = ("client_id", "client_secret", "code")
_DIGITS = re.compile(r"[0-9]{1,7}")

PoolSend = Callable[[Any, str, float], None]  # (argument, task_id, expires_s): tasks.cairn.dispatch_*
Spawn = Callable[[Coroutine[Any, Any, Any], str], Any]


class BadRequest(ValueError):
    """The request cannot be served as sent; the message is safe to show (no input values)."""


def _object(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_REQUEST_BYTES:
        raise BadRequest("request too large")
    try:
        value = json.loads(raw.decode("utf-8") or "{}", parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"request is not JSON ({type(exc).__name__})") from None
    if not isinstance(value, dict):
        raise BadRequest("request is not a JSON object")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _text(request: dict[str, Any], name: str, *, required: bool) -> str:
    value = request.get(name)
    if value is None or value == "":
        if required:
            raise BadRequest(f"missing {name}")
        return ""
    if not isinstance(value, str) or len(value) > MAX_FIELD_CHARS:
        raise BadRequest(f"{name} must be a string")
    return value


def discover_request(raw: bytes) -> dict[str, Any]:
    """The §8 request ``{"account_id", "start_page"}``, checked; raises :class:`BadRequest`."""
    request = _object(raw)
    account_id = _text(request, "account_id", required=True)
    page = request.get("start_page")
    if page is None:
        page = 1
    if isinstance(page, str) and _DIGITS.fullmatch(page):
        page = int(page)
    if isinstance(page, bool) or not isinstance(page, (int, float)) or isinstance(page, float) and (
            not math.isfinite(page) or not page.is_integer()):
        raise BadRequest("start_page must be a positive integer")
    if not 1 <= page <= MAX_START_PAGE:
        raise BadRequest("start_page must be a positive integer")
    return {"account_id": account_id, "start_page": int(page)}


def exchange_request(raw: bytes) -> dict[str, Any]:
    """The §9b request, its string fields checked; raises :class:`BadRequest` (never quoting a secret)."""
    request = _object(raw)
    body = {name: _text(request, name, required=name in EXCHANGE_REQUIRED) for name in EXCHANGE_STRING_FIELDS}
    return {k: v for k, v in body.items() if v}


@dataclass(frozen=True)
class ResponderConfig:
    discover_subject: str
    exchange_subject: str | None  # None: the pool links no OAuth accounts
    queue_group: str
    discover_deadline_s: float
    exchange_deadline_s: float


class PoolCalls:
    """Runs the pool's discover / exchange tasks under a deadline; a result dict, or None.

    In the pool, so the call shares the job tasks' rate limiter and HTTP client. The exchange's
    secrets are parked in Redis (``workers.cairn.sealed``) and only keys travel: nothing secret
    reaches Flower, the result backend or a log.
    """

    def __init__(self, results: TaskResults, send_discover: PoolSend, send_exchange: PoolSend, pool: str = "") -> None:
        self._results = results
        self._pool = pool
        self._send = {"cairn.discover": send_discover, "cairn.exchange": send_exchange}

    async def discover(self, body: dict[str, Any], deadline_s: float) -> dict[str, Any] | None:
        return await self._call("cairn.discover", body, deadline_s)

    async def exchange(self, request_key: str, deadline_s: float) -> dict[str, Any] | None:
        return await self._call("cairn.exchange", request_key, deadline_s)

    async def _call(self, name: str, arg: Any, deadline_s: float) -> dict[str, Any] | None:
        task_id = f"{name}-{self._pool}-{uuid.uuid4().hex}" if self._pool else f"{name}-{uuid.uuid4().hex}"
        watch = await self._results.watch(task_id)
        try:
            await asyncio.to_thread(self._send[name], arg, task_id, deadline_s)
            try:
                meta = await asyncio.wait_for(asyncio.shield(watch.done), timeout=deadline_s)
            except TimeoutError:
                log.warning("%s missed its %.0fs deadline", name, deadline_s)
                return None
        finally:
            await self._results.forget(watch)
        if meta.get("status") != "SUCCESS" or not isinstance(meta.get("result"), dict):
            log.warning("%s failed in the pool (%s)", name, meta.get("status"))
            return None
        return meta["result"]


class Responders:
    """The pool's request/reply subscriptions, in a queue group so the bridge instances share them.

    Every request gets exactly one answer: a malformed one ``{"error": "bad_request"}`` at once,
    without a pool call; a missed deadline or failed task the contract's error shape, never an
    empty success (§8: the UI would show "0 importable activities").
    """

    def __init__(self, nc: NATS, config: ResponderConfig, pool: PoolCalls, sealed_redis: Any, spawn: Spawn) -> None:
        self.nc, self.config, self.pool = nc, config, pool
        self._sealed = sealed_redis  # blocking client: park/unpark the exchange secrets
        self._spawn = spawn
        self._subs: list[Subscription] = []

    async def start(self) -> None:
        c = self.config
        self._subs.append(await self.nc.subscribe(c.discover_subject, queue=c.queue_group, cb=self._on_discover))
        log.info("discover responder on %s (queue group %s)", c.discover_subject, c.queue_group)
        if c.exchange_subject:
            self._subs.append(await self.nc.subscribe(c.exchange_subject, queue=c.queue_group,
                                                      cb=self._on_exchange))
            log.info("oauth exchange responder on %s", c.exchange_subject)

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
        self._spawn(self._answer(msg, self.discover, "discover did not complete; try again"), "discover")

    async def _on_exchange(self, msg: Msg) -> None:
        self._spawn(self._answer(msg, self.exchange, "the code exchange failed in the bridge; retry"),
                    "exchange")

    async def _answer(self, msg: Msg, serve: Callable[[bytes], Coroutine[Any, Any, dict[str, Any]]],
                      fallback: str) -> None:
        """Exactly one reply per request, whatever happens while serving it."""
        try:
            reply = await serve(bytes(msg.data or b""))
        except BadRequest as exc:
            reply = {"error": "bad_request", "message": str(exc)}
        except Exception as exc:  # noqa: BLE001 - the requester must get an answer
            log.warning("%s failed in the bridge: %s", msg.subject, type(exc).__name__)
            reply = {"error": "transient", "message": fallback}
        if msg.reply:
            try:
                await msg.respond(json.dumps(reply, separators=(",", ":")).encode())
            except Exception as exc:  # noqa: BLE001 - the connection is gone; the requester times out
                log.warning("reply on %s not sent: %s", msg.subject, type(exc).__name__)

    async def discover(self, raw: bytes) -> dict[str, Any]:
        body = discover_request(raw)
        reply = await self.pool.discover(body, self.config.discover_deadline_s)
        if reply is None or not valid_discover_reply(reply):
            return {"error": "discover did not complete in the provider pool; try again"}
        return reply

    async def exchange(self, raw: bytes) -> dict[str, Any]:
        request = exchange_request(raw)
        deadline_s = self.config.exchange_deadline_s
        key = await asyncio.to_thread(sealed.park, self._sealed, request, deadline_s + PARK_MARGIN_S)
        del request
        result = await self.pool.exchange(key, deadline_s)
        reply: Any = None
        if result is not None and result.get("reply_key"):
            reply = await asyncio.to_thread(sealed.unpark, self._sealed, str(result["reply_key"]), missing_ok=True)
        if not isinstance(reply, dict):
            await asyncio.to_thread(sealed.discard, self._sealed, key)  # drop the secret if nobody took it
            reply = {"error": "transient", "message": "the code exchange did not complete in time; retry"}
        return reply
