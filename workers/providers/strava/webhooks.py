"""Strava's webhook rules: the subscription handshake and what each push event means.

The generic path (``workers.cairn.handlers.webhooks``) decodes core's envelope, looks
the owner up and publishes; it finds these rules through the provider
(``StravaProvider.webhook_rules()``). This module only knows Strava:

* **Handshake.** Strava validates a new push subscription with
  ``GET callback?hub.mode=subscribe&hub.challenge=…&hub.verify_token=…`` and
  expects ``200 {"hub.challenge": "…"}`` within 2 s. Core relays that GET to
  the pool (reference §2.13); we answer 503 while no
  ``CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN`` is configured (the pool does not take
  webhooks), 400 on another mode, 403 on a wrong token (compared in constant
  time).
* **Events** ``{object_type, object_id, aspect_type, owner_id, subscription_id,
  event_time, updates}``:

  - activity ``create`` → fetch now; its id names the event (``c<event_time>``),
    so Strava's own retries of one delivery collapse onto one job;
  - activity ``update`` (a title or privacy change too: the contract has no
    partial update) → fetch, coalesced: every update of one activity whose
    ``event_time`` falls in the same ``CAIRN_STRAVA_WEBHOOK_COALESCE_S``
    bucket gets the same id (``u<bucket start>``), and is held back until the
    bucket has ended. A burst's events carry *different* event times, so an id
    built from the exact time would never deduplicate; an id built from the
    bucket alone would let an update that arrives after the fetch ran be
    swallowed by JetStream's dedup window. Holding each event until its bucket
    closes means the one fetch that gets through starts after every update it
    stands for (a clock skew of up to ``COALESCE_GRACE_S`` is absorbed);
  - activity ``delete`` → a ``delete`` job: the generic handler fetches it once, so core hears
    ``not_found`` (``workers.cairn.handlers.webhooks``);
  - athlete ``update`` with ``updates.authorized == "false"`` → deauthorized;
  - anything else → ignored (acked).
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from workers.config import load_settings
from workers.logs import register_secret
from workers.providers.webhooks import DEAUTHORIZE, DELETE, FETCH, IGNORE, VerifyReply, WebhookJob

DEFAULT_COALESCE_S = 15.0  # a burst of edits right after an upload fits; the wait is at most this
MAX_COALESCE_S = 240.0  # must stay well inside CAIRN_JOBS' 5-minute dedup window
COALESCE_GRACE_S = 2.0  # our clock may run a little ahead of Strava's event_time
HUB_MODE_SUBSCRIBE = "subscribe"
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"


class StravaWebhookSettings(BaseSettings):
    """``CAIRN_STRAVA_WEBHOOK_*``: the verify token (the Strava worker's variable) and the coalescing bucket."""

    model_config = SettingsConfigDict(env_prefix="CAIRN_STRAVA_WEBHOOK_", extra="ignore", env_ignore_empty=True)

    verify_token: SecretStr | None = None
    coalesce_s: float = Field(default=DEFAULT_COALESCE_S, gt=0, le=MAX_COALESCE_S)


class StravaEvent(BaseModel):
    """One push event (Strava's webhook ``POST`` body). ``updates`` values are strings."""

    model_config = ConfigDict(extra="ignore")

    object_type: str
    object_id: int
    aspect_type: str
    owner_id: int
    subscription_id: int = 0
    event_time: int
    updates: dict[str, Any] = Field(default_factory=dict)


def _reply(status: int, body: bytes, content_type: str = TEXT) -> VerifyReply:
    return VerifyReply(status=status, content_type=content_type, body=body)


class StravaWebhookRules:
    """What the generic webhook path asks of a provider (``workers.providers.webhooks.WebhookRules``)."""

    def __init__(self, settings: StravaWebhookSettings | None = None) -> None:
        self.settings = settings or load_settings(StravaWebhookSettings)
        token = self.settings.verify_token
        self._token = token.get_secret_value() if token is not None else ""
        register_secret(self._token)

    @property
    def enabled(self) -> bool:
        """The pool takes webhooks only with a verify token (as the Strava worker)."""
        return bool(self._token)

    def handshake_token(self) -> str | None:
        """The verify token the subscription handshake must offer (``CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN``)."""
        return self._token or None

    def verify(self, query: dict[str, str]) -> VerifyReply:
        if not self._token:
            return _reply(503, b"webhooks are not configured on this pool")
        if query.get("hub.mode") != HUB_MODE_SUBSCRIBE:
            return _reply(400, b"hub.mode must be subscribe")
        offered = str(query.get("hub.verify_token") or "")
        if not hmac.compare_digest(offered.encode(), self._token.encode()):
            return _reply(403, b"verify token mismatch")
        challenge = str(query.get("hub.challenge") or "")
        return _reply(200, json.dumps({"hub.challenge": challenge}).encode(), JSON)

    def classify(self, body: bytes) -> WebhookJob:
        """The action for one event body; ``ValueError`` when it is not a Strava event."""
        try:
            event = StravaEvent.model_validate_json(body)
        except ValidationError as exc:
            raise ValueError("not a Strava push event: " + "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['type']}" for e in exc.errors()[:5])) from None
        ids = {"owner_id": str(event.owner_id), "object_id": str(event.object_id),
               "subscription_id": str(event.subscription_id) if event.subscription_id else ""}
        if event.object_type == "athlete":
            if event.aspect_type == "update" and str(event.updates.get("authorized", "")).lower() == "false":
                return WebhookJob(action=DEAUTHORIZE, **ids)
            return WebhookJob(action=IGNORE, reason=f"athlete {event.aspect_type}")
        if event.object_type != "activity":
            return WebhookJob(action=IGNORE, reason=f"object_type {event.object_type}")
        if event.aspect_type == "create":
            return WebhookJob(action=FETCH, tag=f"c{event.event_time}", event_time=event.event_time, **ids)
        if event.aspect_type == "update":
            width = float(self.settings.coalesce_s)
            start = int(event.event_time // width * width)
            return WebhookJob(action=FETCH, tag=f"u{start}", not_before=start + width + COALESCE_GRACE_S,
                              event_time=event.event_time, **ids)
        if event.aspect_type == "delete":
            return WebhookJob(action=DELETE, event_time=event.event_time, **ids)
        return WebhookJob(action=IGNORE, reason=f"activity {event.aspect_type}")
