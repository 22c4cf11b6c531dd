"""Fake Strava's webhook side: push subscriptions and the events it pushes.

As Strava documents its Webhook Events API:

* ``POST /api/v3/push_subscriptions`` (form or query: ``client_id``,
  ``client_secret``, ``callback_url``, ``verify_token``) first validates the
  callback: ``GET callback_url?hub.mode=subscribe&hub.challenge=<random>&
  hub.verify_token=<token>`` must answer 200 with JSON ``{"hub.challenge":
  <the same>}`` within 2 s. Then 201 ``{"id": <subscription id>}``. One
  subscription per application (a second is 400 "already exists"); a bad
  client is 401; a failed validation is 400.
* ``GET /api/v3/push_subscriptions?client_id&client_secret`` lists the app's
  subscription (a list of zero or one); ``DELETE
  /api/v3/push_subscriptions/{id}`` (same credentials) → 204.
* An event is ``POST``ed as JSON ``{object_type, object_id, aspect_type,
  owner_id, subscription_id, event_time, updates}`` to the app's callback;
  Strava expects a 200 within 2 s and tries up to three times in all.

The client secret is checked, never recorded or logged.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from devstack.fakes.strava.data import iso_utc

CALLBACK_TIMEOUT_S = 2.0  # Strava's bound on the validation GET and on each event POST
PUSH_ATTEMPTS = 3  # Strava retries an unanswered event, three deliveries in all
FIRST_SUBSCRIPTION_ID = 120_000
CHALLENGE_BYTES = 12


@dataclass
class Subscription:
    id: int
    client_id: str
    callback_url: str
    created_at: float

    def render(self) -> dict[str, Any]:
        return {"id": self.id, "resource_state": 2, "application_id": int(self.client_id)
                if self.client_id.isdigit() else self.client_id, "callback_url": self.callback_url,
                "created_at": iso_utc(self.created_at), "updated_at": iso_utc(self.created_at)}


@dataclass
class PushRecord:
    """One event delivery attempt as Strava made it."""

    subscription_id: int
    event: dict[str, Any]
    status: int  # 0: no answer
    at: float = field(default_factory=time.monotonic)


def _errors(message: str, resource: str, fld: str, code: str) -> dict[str, Any]:
    return {"message": message, "errors": [{"resource": resource, "field": fld, "code": code}]}


class StravaPush:
    """Subscriptions per app and event delivery; ``valid_app(client_id, secret)`` checks credentials."""

    def __init__(self, valid_app: Callable[[str, str], bool], clock: Callable[[], float]) -> None:
        self._valid_app, self._clock = valid_app, clock
        self._lock = threading.Lock()
        self._subs: dict[str, Subscription] = {}  # client_id -> its one subscription
        self._ids = itertools.count(FIRST_SUBSCRIPTION_ID)
        self.pushed: list[PushRecord] = []

    # ---- HTTP ------------------------------------------------------------------------------
    async def _params(self, request: Request) -> dict[str, str]:
        form = {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}
        form.update({k: v for k, v in request.query_params.items() if k not in form})
        return form

    async def collection(self, request: Request) -> Response:
        params = await self._params(request)
        client_id = params.get("client_id", "")
        if not self._valid_app(client_id, params.get("client_secret", "")):
            return JSONResponse(_errors("Authorization Error", "Application", "client_id", "invalid"), 401)
        if request.method == "GET":
            with self._lock:
                sub = self._subs.get(client_id)
            return JSONResponse([sub.render()] if sub else [])
        return await self._create(client_id, params)

    async def _create(self, client_id: str, params: dict[str, str]) -> Response:
        callback, token = params.get("callback_url", ""), params.get("verify_token", "")
        if not callback.startswith(("http://", "https://")):
            return JSONResponse(_errors("Bad Request", "PushSubscription", "callback url", "invalid"), 400)
        with self._lock:
            if client_id in self._subs:
                return JSONResponse(_errors("Bad Request", "PushSubscription", "", "already exists"), 400)
        challenge = secrets.token_urlsafe(CHALLENGE_BYTES)
        try:
            async with httpx.AsyncClient(timeout=CALLBACK_TIMEOUT_S) as client:
                resp = await client.get(callback, params={"hub.mode": "subscribe", "hub.challenge": challenge,
                                                          "hub.verify_token": token})
            ok = resp.status_code == 200 and resp.json().get("hub.challenge") == challenge
        except (httpx.HTTPError, ValueError, AttributeError):
            ok = False
        if not ok:
            return JSONResponse(_errors("Bad Request", "PushSubscription", "callback url",
                                        "GET to callback URL does not return 200"), 400)
        with self._lock:
            if client_id in self._subs:
                return JSONResponse(_errors("Bad Request", "PushSubscription", "", "already exists"), 400)
            sub = Subscription(next(self._ids), client_id, callback, self._clock())
            self._subs[client_id] = sub
        return JSONResponse({"id": sub.id}, 201)

    async def item(self, request: Request) -> Response:
        params = await self._params(request)
        client_id = params.get("client_id", "")
        if not self._valid_app(client_id, params.get("client_secret", "")):
            return JSONResponse(_errors("Authorization Error", "Application", "client_id", "invalid"), 401)
        sub_id = request.path_params["id"]
        with self._lock:
            sub = self._subs.get(client_id)
            if sub is None or sub.id != sub_id:
                return JSONResponse(_errors("Resource Not Found", "PushSubscription", "id", "not found"), 404)
            del self._subs[client_id]
        return Response(status_code=204)

    # ---- events ----------------------------------------------------------------------------
    def subscription(self, client_id: str) -> Subscription | None:
        with self._lock:
            return self._subs.get(client_id)

    def push(self, client_id: str, object_type: str, object_id: int, aspect_type: str, owner_id: int,
             updates: dict[str, Any] | None = None, event_time: int | None = None) -> dict[str, Any] | None:
        """Deliver one event to the app's callback as Strava does; the event, or None without a subscription."""
        sub = self.subscription(client_id)
        if sub is None:
            return None
        event = {"aspect_type": aspect_type, "event_time": int(event_time if event_time is not None
                                                               else self._clock()),
                 "object_id": int(object_id), "object_type": object_type, "owner_id": int(owner_id),
                 "subscription_id": sub.id, "updates": {k: str(v) for k, v in (updates or {}).items()}}
        with httpx.Client(timeout=CALLBACK_TIMEOUT_S) as client:
            for _ in range(PUSH_ATTEMPTS):
                try:
                    status = client.post(sub.callback_url, json=event).status_code
                except httpx.HTTPError:
                    status = 0
                with self._lock:
                    self.pushed.append(PushRecord(sub.id, event, status))
                if status == 200:
                    break
        return event
