"""What a provider says about its webhooks: the rules it hands the generic path, and their answers."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

FETCH, DELETE, DEAUTHORIZE, IGNORE = "fetch", "delete", "deauthorize", "ignore"  # a WebhookJob's actions
WEBHOOK_REASON = "webhook"  # the ``reason`` of a fetch_source job a webhook event enqueued


class WebhookJob(BaseModel):
    """What one event asks of the pool: the admitted form of a CAIRN_WEBHOOKS message.

    ``fetch``: import ``object_id`` (again); ``tag`` names the event or its
    coalescing bucket and ``not_before`` (unix s) holds it back until the bucket
    has closed. ``delete``: the activity is gone upstream. ``deauthorize``: the
    owner revoked the app. ``ignore``: nothing to do (``reason`` says why).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    action: Literal["fetch", "delete", "deauthorize", "ignore"]
    owner_id: str = ""
    subscription_id: str = ""
    object_id: str = ""
    tag: str = ""
    not_before: float | None = None
    event_time: int = 0
    reason: str = ""


@dataclass(frozen=True)
class VerifyReply:
    """The answer to one relayed handshake: HTTP status, content type and body."""

    status: int
    content_type: str
    body: bytes

    def to_wire(self) -> dict[str, Any]:
        """What core decodes (reference §2.13): lower-case keys, the body base64."""
        return {"status": self.status, "content_type": self.content_type,
                "body": base64.b64encode(self.body).decode()}


class WebhookRules(Protocol):
    """A provider's webhook knowledge (``Provider.webhook_rules()``; None: the pool takes none).

    Contract §9a / reference §2.13: what a handshake answers and what an event means is the
    provider's; decoding core's envelope, finding the owner and publishing is the generic path's
    (``workers.cairn.handlers.webhooks``). They meet here, so a provider never imports the NATS layer.

    ``enabled``: the pool takes events (e.g. a verify token is configured);
    ``handshake_token``: the secret the handshake expects, None when unset (the
    conformance check offers it); ``verify``: the reply to a relayed handshake;
    ``classify``: one event body → a :class:`WebhookJob`, ``ValueError`` when it
    is not one of the provider's events.
    """

    @property
    def enabled(self) -> bool: ...

    def handshake_token(self) -> str | None: ...

    def verify(self, query: dict[str, str]) -> VerifyReply: ...

    def classify(self, body: bytes) -> WebhookJob: ...
