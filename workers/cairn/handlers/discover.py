"""discover (contract §8): one round of "what could be imported", answered in the pool."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from workers.cairn.credentials import CredentialsRevoked, CredentialsUnavailable
from workers.cairn.handlers.context import JobContext
from workers.cairn.handlers.fetch_source import provider_context
from workers.logs import redact
from workers.providers.errors import ProviderError, ProviderRateLimited
from workers.providers.models import DiscoverReply, DiscoverRequest

log = logging.getLogger(__name__)

RATE_LIMITED_ERROR = "rate_limited: provider budget exhausted, try again shortly"


def discover(ctx: JobContext, request: dict[str, Any]) -> dict[str, Any]:
    """The §8 reply dict (JSON-able, no secrets).

    The provider returns partial pages and its own errors in the reply; whatever goes wrong
    around it (token fetch, core unreachable, a bug) becomes ``{"error": ...}``, never an empty
    success the UI would show as "0 importable activities". Core marks the account
    rate-limited when the error text says ``rate_limited``.
    """
    try:
        req = DiscoverRequest.model_validate(request or {})
    except ValidationError:
        return {"error": "bad_request"}
    if not req.account_id:
        return {"error": "bad_request"}
    try:
        reply = ctx.provider.discover(provider_context(ctx, req), req)
    except CredentialsRevoked as exc:
        return {"error": exc.code}
    except CredentialsUnavailable:
        return {"error": "transient: token service unavailable, try again"}
    except ProviderRateLimited:
        return {"error": RATE_LIMITED_ERROR}
    except ProviderError as exc:
        return {"error": f"{exc.code}: {redact(str(exc))[:200]}"}
    except Exception as exc:  # noqa: BLE001 - any failure must be an error reply, not an empty success
        log.warning("discover failed: %s", type(exc).__name__)
        return {"error": f"discover failed: {type(exc).__name__}"}
    return _checked(reply)


def valid_discover_reply(reply: object) -> bool:
    """At least one of error/items/complete/next_page present and non-null (reference §5).

    The bridge checks the pool's reply with it before answering core, and the
    conformance check (``switchyard check cairn``) checks the pool's answer with it.
    """
    return isinstance(reply, dict) and any(reply.get(k) is not None
                                           for k in ("error", "items", "complete", "next_page"))


def _checked(reply: DiscoverReply) -> dict[str, Any]:
    body = reply.to_wire()
    if body.get("error"):
        return {"error": str(body["error"])}  # an error reply carries nothing that looks like success
    if not body.get("items") and not body.get("complete") and not body.get("rate_limited"):
        if not body.get("next_page"):
            return {"error": "discover returned no items and no continuation"}
    return body
