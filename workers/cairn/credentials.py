"""Per-job credentials from core: OAuth tokens (``cairn.tokens.<p>.get``) and creds slots."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from workers.cairn.contract.messages import CredsReply, TokenReply, TokenStoreRequest
from workers.cairn.contract.subjects import creds_subject, token_subject
from workers.cairn.nats_conn import CoreRequestError
from workers.errors import PermanentJobError, RetryableJobError
from workers.logs import register_secret
from workers.providers.errors import ProviderAuthError, ProviderError

if TYPE_CHECKING:
    from workers.cairn.handlers.context import JobContext

log = logging.getLogger(__name__)

TOKEN_TIMEOUT_S = 5.0  # the published SDK's token RPC timeout
TOKEN_FRESH_MARGIN_S = 60.0  # "fresh" = expiring more than this far away (reference §3.7)
TRANSIENT_RETRY_DEFAULT_S = 30.0  # core's retry_after when it does not say


class CredentialsRevoked(PermanentJobError):
    """The account is gone or needs re-authorisation: the job can never succeed.

    Core's ``account_gone`` and ``needs_reauth`` (reference §2.5, §3.7): failure envelope + Term.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.error_class = "ERROR_CLASS_AUTH_EXPIRED" if code == "needs_reauth" else "ERROR_CLASS_AUTH_INVALID"


class CredentialsUnavailable(RetryableJobError):
    """Core could not answer now; retry after ``retry_after_s``.

    ``transient`` carries core's ``retry_after``; ``bad_request`` or no reply NAK too.
    """

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class _Secretive(BaseModel):
    """Credentials live per job in memory only (contract §9, S2): registered with the redactor, hidden from ``repr``."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class Tokens(TokenReply):
    """A usable token-get reply (the wire model, frozen); ``access_token``, ``refresh_token``
    and ``client_secret`` are secrets and stay out of ``repr``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    def fresh(self, now: datetime | None = None) -> bool:
        now = now or datetime.now(UTC)
        if not self.access_token:
            return False
        if self.expires_at is None:
            return True
        return self.expires_at.astimezone(UTC) - now > timedelta(seconds=TOKEN_FRESH_MARGIN_S)


class Creds(_Secretive):
    """A creds-get reply: the connection's two slots (0.7 aliases email/password accepted)."""

    client_id: str = Field(default="", repr=False)
    client_secret: str = Field(default="", repr=False)


def _register(*values: str | None) -> None:
    for value in values:
        register_secret(value)


def _raise_for_error(reply: dict[str, Any], what: str) -> None:
    error = str(reply.get("error") or "")
    if not error:
        return
    if error in ("account_gone", "needs_reauth", "revoked"):
        raise CredentialsRevoked(error, f"{what}: {error}")
    if error == "transient":
        retry = reply.get("retry_after")
        delay = float(retry) if isinstance(retry, (int, float)) and retry > 0 else TRANSIENT_RETRY_DEFAULT_S
        raise CredentialsUnavailable(f"{what}: transient", delay)
    raise CredentialsUnavailable(f"{what}: {error[:80]}")


def _request(ctx: JobContext, subject: str, body: dict[str, Any], what: str) -> dict[str, Any]:
    try:
        reply = ctx.request(subject, body, TOKEN_TIMEOUT_S)
    except CoreRequestError as exc:
        raise CredentialsUnavailable(f"{what}: {exc}") from None
    for key in ("access_token", "refresh_token", "client_secret", "password"):
        value = reply.get(key)
        if isinstance(value, str):
            register_secret(value)
    return reply


def get_tokens(ctx: JobContext, account_id: str) -> Tokens:
    """Core's current token state for ``account_id`` (one ``get``), no refresh."""
    reply = _request(ctx, token_subject(ctx.provider_name, "get"), {"account_id": account_id}, "token get")
    _raise_for_error(reply, "token get")
    tokens = Tokens.model_validate(reply)
    if not tokens.access_token:
        raise CredentialsRevoked("account_gone", "token get: no access token stored")
    return tokens


def fetch_tokens(ctx: JobContext, account_id: str) -> Tokens:
    """A usable access token: core's, or refreshed with the provider and stored back.

    Stored with optimistic concurrency (``previous_expires_at``): ``stale_store`` means another
    instance refreshed first, so core's token is read again. A refused refresh reads core once
    more too (a rotating provider may have retired our refresh token for a stored fresh one);
    otherwise core is told ``needs_reauth`` and the job is termed.
    """
    tokens = get_tokens(ctx, account_id)
    if tokens.fresh():
        return tokens
    if not tokens.refresh_token:
        return tokens  # nothing we can do; the provider answers 401 if it really expired
    try:
        new = ctx.provider.refresh_oauth(ctx.http, client_id=tokens.client_id,
                                         client_secret=tokens.client_secret,
                                         refresh_token=tokens.refresh_token)
    except ProviderAuthError as exc:
        superseded = _refreshed_elsewhere(ctx, account_id, tokens)
        if superseded is not None:
            return superseded
        _needs_reauth(ctx, account_id, exc.code or "refresh_failed")
        raise CredentialsRevoked("needs_reauth", f"token refresh refused ({exc.code})") from None
    except ProviderError as exc:
        raise CredentialsUnavailable(f"token refresh: {exc.code}") from None
    if new is None:
        return tokens  # the provider cannot refresh: as without a refresh token
    _register(new.access_token, new.refresh_token)
    return _store(ctx, account_id, tokens, new)


def _refreshed_elsewhere(ctx: JobContext, account_id: str, read: Tokens) -> Tokens | None:
    """Core's token when another instance refreshed (and stored) since we read ``read``, else None.

    A provider that rotates refresh tokens retires the one we hold as soon as
    another instance of the pool refreshes with it; its refusal then means
    "superseded", not "the user revoked us". Only a fresh, different token in
    core proves that; otherwise the refusal stands and the account needs reauth.
    """
    current = get_tokens(ctx, account_id)
    if current.access_token != read.access_token and current.fresh():
        log.info("token refresh for account %s refused, but core holds a newer token; using it", account_id)
        return current
    return None


def _store(ctx: JobContext, account_id: str, old: Tokens, new: Any) -> Tokens:
    """``.store`` with optimistic concurrency: core writes only if its expiry is still ours."""
    expires = new.expires_at.astimezone(UTC)
    body = TokenStoreRequest(account_id=account_id, access_token=new.access_token,
                             refresh_token=new.refresh_token, expires_at=expires, scope=new.scope,
                             token_type=new.token_type, previous_expires_at=old.expires_at).to_wire()
    reply = _request(ctx, token_subject(ctx.provider_name, "store"), body, "token store")
    if reply.get("ok"):
        return old.model_copy(update={"access_token": new.access_token,
                                      "refresh_token": new.refresh_token or old.refresh_token,
                                      "expires_at": expires, "scope": new.scope or old.scope})
    error = str(reply.get("error") or "")
    if error == "stale_store":  # another instance refreshed first: use core's state
        return get_tokens(ctx, account_id)
    _raise_for_error(reply, "token store")
    raise CredentialsUnavailable("token store: not stored")


def _needs_reauth(ctx: JobContext, account_id: str, reason: str) -> None:
    try:
        ctx.request(token_subject(ctx.provider_name, "needs_reauth"),
                    {"account_id": account_id, "reason": reason}, TOKEN_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - best effort; the Term stands anyway
        log.warning("needs_reauth for account %s not delivered: %s", account_id, type(exc).__name__)


def report_needs_reauth(ctx: JobContext, account_id: str, reason: str = "unauthorized") -> None:
    """Tell core the provider refused the token (a 401 on an API call)."""
    _needs_reauth(ctx, account_id, reason)


def fetch_creds(ctx: JobContext, account_id: str) -> Creds:
    """The connection's ``client_id``/``client_secret`` slots (credential providers)."""
    reply = _request(ctx, creds_subject(ctx.provider_name), {"account_id": account_id}, "creds get")
    _raise_for_error(reply, "creds get")
    client_id, client_secret = CredsReply.model_validate(reply).login
    creds = Creds(client_id=client_id, client_secret=client_secret)
    _register(creds.client_id, creds.client_secret)
    return creds
