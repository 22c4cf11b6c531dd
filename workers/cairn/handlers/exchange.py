"""OAuth code exchange (contract §9b) in the pool."""

from __future__ import annotations

import logging
from typing import Any

from workers.cairn.handlers.context import JobContext
from workers.logs import redact, register_secret
from workers.providers.errors import (
    ProviderAuthError,
    ProviderPermanentError,
    ProviderRateLimited,
    ProviderTransientError,
)

log = logging.getLogger(__name__)

REQUIRED_FIELDS = ("client_id", "client_secret", "code")
MESSAGE_MAX_CHARS = 200


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": code, "message": redact(message)[:MESSAGE_MAX_CHARS]}


def exchange(ctx: JobContext, request: dict[str, Any]) -> dict[str, Any]:
    """The §9b reply: tokens + ``provider_account_id``, or ``{"error", "message"}``.

    Request and reply cross between bridge and task only as sealed Redis keys
    (``workers.cairn.sealed``); every secret is registered with the redactor before the provider
    sees it, and the worker keeps nothing (core stores the tokens).
    """
    if not isinstance(request, dict):
        return _error("bad_request", "request is not an object")
    for key in ("client_secret", "code", "code_verifier"):
        value = request.get(key)
        if isinstance(value, str):
            register_secret(value)
    missing = [k for k in REQUIRED_FIELDS if not str(request.get(k) or "").strip()]
    if missing:
        return _error("bad_request", f"missing {', '.join(missing)}")
    try:
        tokens = ctx.provider.exchange_oauth(
            ctx.http, client_id=str(request["client_id"]), client_secret=str(request["client_secret"]),
            code=str(request["code"]), redirect_uri=str(request.get("redirect_uri") or ""),
            code_verifier=str(request["code_verifier"]) if request.get("code_verifier") else None)
    except ProviderAuthError as exc:
        return _error("exchange_failed", f"the provider refused the code ({exc.code})")
    except (ProviderTransientError, ProviderRateLimited) as exc:
        return _error("transient", f"the provider is unavailable ({type(exc).__name__}); retry")
    except ProviderPermanentError as exc:
        return _error("exchange_failed", f"{exc.code}: {exc}")
    except Exception as exc:  # noqa: BLE001 - the requester must get an answer within 20 s
        log.warning("oauth exchange failed: %s", type(exc).__name__)
        return _error("transient", f"exchange failed ({type(exc).__name__}); retry")
    register_secret(tokens.access_token)
    register_secret(tokens.refresh_token)
    if not tokens.provider_account_id:  # §9b: core links the connection by this id
        return _error("exchange_failed", "the provider named no account id")
    log.info("oauth exchange done for provider account %s", tokens.provider_account_id)
    return tokens.to_wire()
