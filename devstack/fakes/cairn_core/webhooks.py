"""Core's webhook forwarder (reference §2.13): ``POST``/``GET /webhooks/<key>`` → NATS, on loopback.

What core does, reproduced on purpose:

* ``POST /webhooks/{key}`` (key: ASCII alnum, ``-``, ``_``, ≤ 64 chars; 120 per
  minute per source address; body ≤ 1 MiB else 413) publishes the envelope
  ``{"provider": key, "headers": {lower-cased first values…,
  "x-webhook-source-addr", "x-webhook-received-at"}, "body": base64}`` to
  ``cairn.webhooks.<key>.event`` with ``Nats-Msg-Id`` ``<key>:<received-at to
  the second>`` (so two webhooks in one second collide and JetStream drops the
  second: core's defect, kept, because a worker must live with it); 200 on
  publish success, 502 on failure.
* ``GET /webhooks/{key}`` sends ``{"method": "GET", "query": {first value per
  param}}`` to ``cairn.webhooks.<key>.verify`` (3 s, 503 when nothing answers)
  and answers the decoded ``{status, content_type, body}`` (status 0 → 200,
  empty content type → ``application/json``).

The HTTP server runs on its own thread (``BackgroundServer``); publishing and
requesting run on the dev core's loop, where its NATS connection lives.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from nats.js import JetStreamContext
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from devstack.fakes.cairn_core import subjects as subj
from devstack.fakes.http_server import BackgroundServer
from devstack.infra.services import listen_host

MAX_BODY_BYTES = 1 << 20  # 1 MiB
VERIFY_TIMEOUT_S = 3.0
PER_IP_PER_MINUTE = 120
RATE_WINDOW_S = 60.0
KEY_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DEFAULT_CONTENT_TYPE = "application/json"
PUBLISH_TIMEOUT_S = 5.0


def received_at(now: datetime) -> str:
    """RFC 3339 with nanoseconds, as Go's ``time.RFC3339Nano`` (the header value)."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


def envelope(key: str, body: bytes, headers: dict[str, str], source_addr: str, now: datetime) -> bytes:
    hdrs = {k.lower(): v for k, v in headers.items()}
    hdrs |= {"x-webhook-source-addr": source_addr, "x-webhook-received-at": received_at(now)}
    return json.dumps({"provider": key, "headers": hdrs, "body": base64.b64encode(body).decode()}).encode()


def event_msg_id(key: str, now: datetime) -> str:
    """``<key>:<received-at, second resolution>`` (two in one second collide, as in core)."""
    return f"{key}:{now.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


async def forward_event(js: JetStreamContext, key: str, body: bytes, headers: dict[str, str],
                        source_addr: str, now: datetime) -> None:
    await js.publish(subj.webhook_event_subject(key), envelope(key, body, headers, source_addr, now),
                     headers={"Nats-Msg-Id": event_msg_id(key, now)}, timeout=PUBLISH_TIMEOUT_S)


async def relay_verify(nc: Any, key: str, query: dict[str, str],
                       timeout_s: float = VERIFY_TIMEOUT_S) -> tuple[int, str, bytes]:
    """(status, content type, body) of the pool's verify answer; raises on no answer."""
    msg = await nc.request(subj.webhook_verify_subject(key), json.dumps({"method": "GET", "query": query}).encode(),
                           timeout=timeout_s)
    reply = {k.lower(): v for k, v in json.loads(msg.data).items()}  # Go decodes case-insensitively
    status = int(reply.get("status") or 0) or 200
    content_type = str(reply.get("content_type") or "") or DEFAULT_CONTENT_TYPE
    return status, content_type, base64.b64decode(str(reply.get("body") or ""))


class WebhookHttp:
    """The two routes, served on 127.0.0.1; ``run`` hands a coroutine to the core's loop."""

    def __init__(self, run: Callable[[Coroutine[Any, Any, Any]], Any], js: Callable[[], JetStreamContext],
                 nc: Callable[[], Any], clock: Callable[[], datetime]) -> None:
        self._run, self._js, self._nc, self._clock = run, js, nc, clock
        self._hits: dict[str, deque[float]] = {}
        self._lock = threading.Lock()
        self.received: list[tuple[str, float]] = []  # (key, monotonic time) of every accepted POST
        self.http: BackgroundServer | None = None
        self.app = Starlette(routes=[Route("/webhooks/{key}", self._endpoint, methods=["GET", "POST"])])

    @property
    def base_url(self) -> str:
        assert self.http is not None, "not started"
        return f"http://{listen_host()}:{self.http.port}"

    def url(self, key: str) -> str:
        return f"{self.base_url}/webhooks/{key}"

    def start(self, port: int = 0) -> WebhookHttp:
        self.http = BackgroundServer(self.app, "dev-core-webhooks", port).start()
        return self

    def stop(self) -> None:
        if self.http is not None:
            self.http.stop()
            self.http = None

    def _allowed(self, addr: str) -> bool:
        now = time.monotonic()
        with self._lock:
            hits = self._hits.setdefault(addr, deque())
            while hits and now - hits[0] > RATE_WINDOW_S:
                hits.popleft()
            if len(hits) >= PER_IP_PER_MINUTE:
                return False
            hits.append(now)
            return True

    async def _endpoint(self, request: Request) -> Response:
        key = request.path_params["key"]
        if not KEY_PATTERN.match(key):
            return Response("bad webhook key", 400)
        addr = request.client.host if request.client else ""
        if not self._allowed(addr):
            return Response("too many requests", 429)
        if request.method == "GET":
            return await self._verify(key, request)
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                return Response("payload too large", 413)
        headers: dict[str, str] = {}
        for name, value in request.headers.items():  # first value per header, as core
            headers.setdefault(name.lower(), value)
        try:
            await asyncio.wrap_future(self._run(forward_event(self._js(), key, body, headers, addr, self._clock())))
        except Exception:  # noqa: BLE001 - what core answers when the publish fails
            return Response("publish failed", 502)
        with self._lock:
            self.received.append((key, time.monotonic()))
        return Response("ok", 200)

    async def _verify(self, key: str, request: Request) -> Response:
        query: dict[str, str] = {}
        for name, value in request.query_params.multi_items():
            query.setdefault(name, value)
        try:
            status, content_type, body = await asyncio.wrap_future(self._run(relay_verify(self._nc(), key, query)))
        except Exception:  # noqa: BLE001 - no responder, timeout, malformed reply
            return Response("no webhook verifier answered", 503)
        return Response(body, status, media_type=content_type)
