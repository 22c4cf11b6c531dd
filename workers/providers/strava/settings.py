"""Strava provider settings (``CAIRN_STRAVA_*``)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from workers.providers.strava.client import AUTHORIZE_PATH, DEFAULT_BASE_URL, TOKEN_PATH
from workers.providers.strava.segments import SEGMENT_CACHE_MAX_ENTRIES, SEGMENT_CACHE_TTL_S


class StravaSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CAIRN_STRAVA_", extra="ignore")

    base_url: str = DEFAULT_BASE_URL  # the dev stack points it at a fake Strava; API at /api/v3, OAuth at /oauth
    token_url: str = ""  # CAIRN_STRAVA_TOKEN_URL: full URL overriding <base_url>/oauth/token
    gear_cache_ttl_s: float = 3600.0
    segment_cache_max_entries: int = Field(default=SEGMENT_CACHE_MAX_ENTRIES, ge=1)
    segment_cache_ttl_s: float = Field(default=SEGMENT_CACHE_TTL_S, gt=0)

    @property
    def effective_token_url(self) -> str:
        return self.token_url or self.base_url + TOKEN_PATH

    @property
    def authorize_url(self) -> str:
        return self.base_url + AUTHORIZE_PATH

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        """https, or plain http on a loopback host (a fake Strava on this machine): the manifest
        shows core's users ``<base_url>/oauth/authorize``, and contract §1 allows http there only
        on loopback, so any other http URL would keep the pool from ever publishing its manifest."""
        value = value.strip().rstrip("/")
        parts = urlsplit(value)
        if parts.scheme == "https" and parts.hostname:
            return value
        if parts.scheme == "http" and parts.hostname and _loopback(parts.hostname):
            return value
        raise ValueError("must be an https URL (plain http only on a loopback host)")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
