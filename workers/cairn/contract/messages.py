"""Pydantic models for the JSON request/reply bodies and KV records of contract 0.7."""

from __future__ import annotations

import ipaddress
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_serializer, field_validator

from workers.cairn.contract.wire import parse_rfc3339, rfc3339
from workers.providers.base import AUTH_OAUTH2

SHA256_HEX_PATTERN = r"^[0-9a-f]{64}$"
EXCHANGE_ERRORS = ("exchange_failed", "bad_request", "transient")


class Inbound(BaseModel):
    """A body core sends us: unknown fields ignored (core adds some between releases), never an error.

    Job payloads are :mod:`workers.cairn.contract.jobs`; provider bodies (discover, ``OAuthTokens``) are
    :mod:`workers.providers.models`. Secret-bearing fields are ``repr=False``.
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class Outbound(BaseModel):
    """A body we send: no extra fields, timestamps as RFC 3339 ``Z`` (Go parses nothing without a zone)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_serializer("*", when_used="json")
    def _times(self, value: Any) -> Any:
        return rfc3339(value) if isinstance(value, datetime) else value

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


def _go_time(value: Any) -> Any:
    """Go's zero time (``0001-01-01T00:00:00Z``) and "" mean "no time"."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return parse_rfc3339(value)
    return value


GoTime = Annotated[datetime | None, BeforeValidator(_go_time)]
"""A timestamp core's Go code sends: its zero time and "" are None (one rule for every such field)."""


def https_or_loopback(url: str) -> str:
    """Manifest URLs must be https; http only on a loopback host (contract §1)."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme == "http" and parts.hostname:
        host = parts.hostname
        try:
            if host == "localhost" or ipaddress.ip_address(host).is_loopback:
                return url
        except ValueError:
            pass
    raise ValueError("must be an https URL (http only on a loopback host)")


# --------------------------------------------------------------------------- OAuth exchange (§9b)

class OAuthExchangeRequest(Inbound):
    connection_id: str = ""
    client_id: str = Field(min_length=1)
    client_secret: str = Field(min_length=1, repr=False)
    code: str = Field(min_length=1, repr=False)
    redirect_uri: str = ""
    code_verifier: str | None = Field(default=None, repr=False)


class OAuthExchangeError(Outbound):
    error: Literal["exchange_failed", "bad_request", "transient"]
    message: str = ""


# --------------------------------------------------------------------------- tokens / creds (§9)

class AccountRequest(Outbound):
    """``{"account_id"}``: token get and creds get."""

    account_id: str = Field(min_length=1)


class TokenReply(Inbound):
    """A ``cairn.tokens.<p>.get`` reply; ``expires_at`` is Go's zero time on error replies."""

    access_token: str = Field(default="", repr=False)
    refresh_token: str = Field(default="", repr=False)
    expires_at: GoTime = None
    scope: str = ""
    token_type: str = "Bearer"
    client_id: str = ""
    client_secret: str = Field(default="", repr=False)
    app_id: str = ""
    error: str = ""
    retry_after: float | None = None


class TokenStoreRequest(Outbound):
    account_id: str = Field(min_length=1)
    access_token: str = Field(min_length=1, repr=False)
    refresh_token: str = Field(default="", repr=False)
    expires_at: datetime
    scope: str = ""
    token_type: str = "Bearer"
    previous_expires_at: datetime | None = None

    def to_wire(self) -> dict[str, Any]:
        body = super().to_wire()
        body.setdefault("previous_expires_at", "0001-01-01T00:00:00Z")  # "no token yet" (Go zero)
        return body


class OkReply(Inbound):
    """``{"ok": true}`` / ``{"ok": false, "error": ...}`` (token store, needs_reauth)."""

    ok: bool = False
    error: str = ""


class NeedsReauthRequest(Outbound):
    account_id: str = Field(min_length=1)
    reason: str = "refresh_failed"


class CredsReply(Inbound):
    """``cairn.creds.<p>.get``: the connection's slots (``email``/``password`` aliases until 0.8)."""

    client_id: str = Field(default="", repr=False)
    client_secret: str = Field(default="", repr=False)
    email: str = Field(default="", repr=False)
    password: str = Field(default="", repr=False)
    error: str = ""

    @property
    def login(self) -> tuple[str, str]:
        return self.client_id or self.email, self.client_secret or self.password


# --------------------------------------------------------------------------- presign (reference §2.6)

class PresignUploadRequest(Outbound):
    provider: str = Field(min_length=1)
    kind: Literal["result", "raw"] = "result"
    content_type: str = Field(min_length=1)
    content_length: int = Field(ge=0)
    content_sha256: str | None = Field(default=None, pattern=SHA256_HEX_PATTERN)
    user_id: str | None = None
    source_id: str | None = None


class PresignUploadReply(Inbound):
    method: str = "PUT"
    url: str = Field(min_length=1, repr=False)  # carries the signature
    blob_id: str = Field(min_length=1)
    expires_at: GoTime = None
    required_headers: dict[str, str] = Field(default_factory=dict, repr=False)


class PresignDownloadRequest(Outbound):
    blob_id: str = Field(min_length=1)
    handle: str | None = None


class PresignDownloadReply(Inbound):
    method: str = "GET"
    url: str = Field(min_length=1, repr=False)
    blob_id: str = ""
    expires_at: GoTime = None


# --------------------------------------------------------------------------- account lookup (§9a)

class AccountLookupRequest(Outbound):
    external_id: str = Field(min_length=1)
    subscription_id: str | None = None


class AccountLookupReply(Inbound):
    account_id: str = ""
    user_id: str = ""
    error: str = ""


# --------------------------------------------------------------------------- presence / manifest

class Capability(Outbound):
    read: bool = False
    write: bool = False
    backfill: bool = False
    granularity: str | None = None


class PresenceRecord(Outbound):
    """Contract §2: written every ~20 s under ``<worker_name>.<instance_id>``."""

    worker_name: str = Field(min_length=1)
    worker_key: str = Field(min_length=1)
    instance_id: str = Field(min_length=1)
    version: str = Field(pattern=r"^\d+\.\d+$")  # parser N.M
    release: str = Field(min_length=1)  # vX.Y.Z
    provider: str = Field(min_length=1)
    package: str = Field(min_length=1)
    webhooks: bool = False
    capabilities: dict[str, Capability] | None = None
    last_seen: datetime


class OAuthMeta(Outbound):
    authorize_url: str
    scopes: list[str] = Field(default_factory=list)
    scope_separator: str = " "
    pkce: bool = False
    authorize_params: dict[str, str] = Field(default_factory=dict)

    @field_validator("authorize_url")
    @classmethod
    def _https(cls, value: str) -> str:
        return https_or_loopback(value)


class ConfigField(Outbound):
    key: Literal["client_id", "client_secret"]  # only these two slots exist
    label: str = Field(min_length=1)
    help: str | None = None
    secret: bool | None = None


class ProviderMeta(Outbound):
    display_name: str = Field(min_length=1)
    activity_url_template: str | None = None
    setup_docs_url: str | None = None
    auth_method: Literal["oauth2", "credentials"]
    oauth: OAuthMeta | None = None
    config_fields: list[ConfigField] = Field(default_factory=list)

    @field_validator("activity_url_template", "setup_docs_url")
    @classmethod
    def _https(cls, value: str | None) -> str | None:
        return None if value is None else https_or_loopback(value)

    @field_validator("oauth")
    @classmethod
    def _oauth_needs_block(cls, value: OAuthMeta | None, info: Any) -> OAuthMeta | None:
        if info.data.get("auth_method") == AUTH_OAUTH2 and value is None:
            raise ValueError("auth_method oauth2 needs an oauth block")
        return value


class ManifestRecord(Outbound):
    """Contract §1: under ``<worker_name>`` at start and again within the 15-min TTL.

    ``capabilities`` is not in §1's example record, but §3/§4 gate the gear and
    metrics jobs on what "the manifest declares"; a published core ignores the
    extra key (its manifest watcher reads five fields, reference §2.10).
    """

    worker_name: str = Field(min_length=1)
    version: str = Field(pattern=r"^\d+\.\d+$")
    provider: str = Field(min_length=1)
    package: str = Field(min_length=1)
    updated_at: datetime
    # The pool's DataTypes, the same map as presence: core publishes import_gear / import_metrics
    # only to a pool whose manifest declares Gear / a metric type (contract §3, §4).
    capabilities: dict[str, Capability] | None = None
    provider_meta: ProviderMeta | None = None  # MUST for a pool that links accounts; parser-only pools omit
