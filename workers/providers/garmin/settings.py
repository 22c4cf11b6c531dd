"""Garmin provider settings (``CAIRN_GARMIN_*``).

Why a domain, a proxy and a CA bundle and not a base URL: garth builds every
URL as ``https://<subdomain>.<domain>`` (``sso``, ``connectapi``) and fetches
its OAuth consumer from a fixed https URL, so there is no base URL to point
elsewhere. Its documented knobs are ``Client.configure(domain=, proxies=,
ssl_verify=)``: production keeps ``garmin.com``, no proxy and the system CA
store; the dev stack sends everything through a local CONNECT proxy to the fake
Garmin Connect, whose certificate ``CAIRN_GARMIN_CA_BUNDLE`` trusts
(docs/DESIGN.md, "Garmin: pointing garth at the fake").

Requests lets ``REQUESTS_CA_BUNDLE`` override a session's CA bundle, and garth's
OAuth1 session inherits the environment, so a Garmin pool with its own bundle
must not have that variable pointing elsewhere (``check_environment``).

garth can persist its session: ``GARTH_HOME`` (token files written after every
login) or ``GARTH_TOKEN`` (a session resumed from the environment). The pool
persists no provider credentials (S2), so either variable stops it at start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from workers.errors import ConfigError

DEFAULT_DOMAIN = "garmin.com"
SESSION_CACHE_MAX_ACCOUNTS = 256  # garth sessions kept in memory per process (LRU)
SESSION_IDLE_TTL_S = 6 * 3600.0  # a session unused this long is dropped (its OAuth2 token lives ~1 day)
HTTP_TIMEOUT_S = 30  # garth's per-request timeout (an original FIT download can be a few MB)
# Connect requests per minute per connected account: deliberately below what garminconnect users report
# being throttled at (a burst of ~100 calls); an import is three requests.
REQUESTS_PER_MINUTE = 30
MAX_DOWNLOAD_BYTES = 64 * 1024 * 1024  # an original-file zip above this is refused (the archive bound)
PERSISTING_VARIABLES = ("GARTH_HOME", "GARTH_TOKEN")
# requests lets these override Session.verify on every request that does not pass verify itself
# (psf/requests#3829); garth's OAuth1 session copies our verify but not our environment handling.
CA_OVERRIDING_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
# garth's own telemetry (GarthSettings ``GARTH_TELEMETRY_*``, off by default) would send every Garmin
# request's trace to Pydantic Logfire's servers under garth's shared token: a login's requests leave
# the pool for a third party. Refused, as a persisted session is.
TELEMETRY_VARIABLES = ("GARTH_TELEMETRY_ENABLED", "GARTH_TELEMETRY_SEND_TO_LOGFIRE")
FALSE_WORDS = ("", "0", "false", "no", "off")  # what pydantic reads as False for a bool


class GarminSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CAIRN_GARMIN_", extra="ignore", env_ignore_empty=True)

    domain: str = DEFAULT_DOMAIN
    proxy_url: str = ""  # CAIRN_GARMIN_PROXY_URL: every Garmin request through this HTTP(S) proxy
    ca_bundle: str = ""  # CAIRN_GARMIN_CA_BUNDLE: a PEM file to verify Garmin's TLS with (default: system)
    timeout_s: int = Field(default=HTTP_TIMEOUT_S, gt=0)
    session_cache_max: int = Field(default=SESSION_CACHE_MAX_ACCOUNTS, ge=1)
    session_idle_ttl_s: float = Field(default=SESSION_IDLE_TTL_S, gt=0)
    max_download_bytes: int = Field(default=MAX_DOWNLOAD_BYTES, gt=0)
    requests_per_minute: int = Field(default=REQUESTS_PER_MINUTE, ge=1)

    @field_validator("domain")
    @classmethod
    def _bare_domain(cls, value: str) -> str:
        value = value.strip().strip(".")
        if not value or "/" in value or ":" in value:
            raise ValueError("must be a bare domain such as garmin.com (garth adds https://sso. etc.)")
        return value

    @field_validator("proxy_url")
    @classmethod
    def _proxy(cls, value: str) -> str:
        value = value.strip()
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s):// proxy URL")
        return value

    @field_validator("ca_bundle")
    @classmethod
    def _bundle_exists(cls, value: str) -> str:
        value = value.strip()
        if value and not Path(value).is_file():
            raise ValueError("must name a readable PEM file")
        return value


def check_environment(settings: GarminSettings, environ: Mapping[str, str] | None = None) -> None:
    """``ConfigError`` naming the variable when the environment would defeat the settings.

    ``GARTH_HOME`` / ``GARTH_TOKEN``: garth would persist or resume sessions (see module doc).
    ``GARTH_TELEMETRY_*`` switched on: garth would send request traces to Logfire (S1).
    ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` next to ``CAIRN_GARMIN_CA_BUNDLE``: requests
    would verify garth's OAuth requests against that bundle instead of ours.
    """
    env = os.environ if environ is None else environ
    for name in PERSISTING_VARIABLES:
        if env.get(name):
            raise ConfigError(f"{name}: garth would persist Garmin sessions outside the pool; unset it "
                              "(the Garmin pool keeps sessions in memory only)")
    for name in TELEMETRY_VARIABLES:
        if env.get(name, "").strip().lower() not in FALSE_WORDS:
            raise ConfigError(f"{name}: garth would send Garmin request traces to a third party (Logfire); "
                              "unset it for the Garmin pool")
    for name in CA_OVERRIDING_VARIABLES:
        if settings.ca_bundle and env.get(name) and env[name] != settings.ca_bundle:
            raise ConfigError(f"{name}: overrides CAIRN_GARMIN_CA_BUNDLE inside garth's OAuth session; "
                              "unset it for the Garmin pool or point it at the same file")
