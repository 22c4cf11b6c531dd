"""Every Redis client of the fleet is built here, from one ``REDIS_URL``."""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel
from pydantic import Field, FilePath, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from workers import dead_peers
from workers.config import load_settings

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
SENTINEL_SCHEME = "sentinel://"
SENTINEL_SEPARATOR = ";"
DEFAULT_SENTINEL_PORT = 26379
# A Sentinel that does not answer within this long is skipped for the next one.
SENTINEL_SOCKET_TIMEOUT_S = 1.0
# A dead master's TCP connect must fail fast, so the client asks the Sentinels again.
SOCKET_CONNECT_TIMEOUT_S = 5.0
SSL_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class RedisSettings(BaseSettings):
    """``REDIS_URL`` and its companions; every process reads Redis settings through this class.

    The broker, result backend, leases, fleet records, ledgers and sealed secrets must all
    follow the same Redis through a Sentinel failover; a client built elsewhere would keep
    talking to a demoted master.
    """

    model_config = SettingsConfigDict(extra="ignore", env_ignore_empty=True)

    redis_url: str = Field(default=DEFAULT_REDIS_URL, validation_alias="REDIS_URL")
    sentinel_master: str | None = Field(default=None, validation_alias="REDIS_SENTINEL_MASTER")
    # Heroku Redis presents a self-signed certificate: its documented setting is ``none``.
    ssl_cert_reqs: Literal["none", "optional", "required"] = Field(default="none",
                                                                   validation_alias="REDIS_SSL_CERT_REQS")
    # The CA bundle (PEM) a ``rediss://`` server's certificate is checked against; the system's CAs if unset.
    ssl_ca_certs: FilePath | None = Field(default=None, validation_alias="REDIS_SSL_CA_CERTS")

    @field_validator("redis_url")
    @classmethod
    def _scheme(cls, value: str) -> str:
        if is_sentinel(value):
            parse_sentinel_url(value)  # raises ValueError on a malformed entry
        elif not value.startswith(("redis://", "rediss://")):
            raise ValueError("must be a redis://, rediss:// or sentinel:// URL")
        return value

    @model_validator(mode="after")
    def _master_named(self) -> RedisSettings:
        if is_sentinel(self.redis_url) and not self.sentinel_master:
            raise ValueError("REDIS_SENTINEL_MASTER must name the master when REDIS_URL lists Sentinels")
        return self

    @model_validator(mode="after")
    def _ca_checked(self) -> RedisSettings:
        """A CA bundle that ``none`` would never read is a mistake, not a choice: say so at start."""
        if self.ssl_ca_certs is not None and self.ssl_cert_reqs == "none":
            raise ValueError("REDIS_SSL_CA_CERTS is set, but REDIS_SSL_CERT_REQS=none checks no certificate: "
                             "set REDIS_SSL_CERT_REQS=required")
        return self

    @property
    def sentinel(self) -> bool:
        return is_sentinel(self.redis_url)

    @property
    def tls_options(self) -> dict[str, Any]:
        """What every client of a ``rediss://`` URL is given (redis-py's, kombu's and Celery's names)."""
        options: dict[str, Any] = {"ssl_cert_reqs": SSL_CERT_REQS[self.ssl_cert_reqs]}
        if self.ssl_ca_certs is not None:
            options["ssl_ca_certs"] = str(self.ssl_ca_certs)
        return options


@dataclass(frozen=True)
class SentinelURL:
    """A parsed Sentinel list, spelled as Celery and kombu spell it.

    ``sentinel://:password@10.0.0.1:26379/0;sentinel://10.0.0.2:26379`` with
    ``REDIS_SENTINEL_MASTER`` naming the master; password and db come from the first entry.
    """

    hosts: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None


def is_sentinel(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEME)


def parse_sentinel_url(url: str) -> SentinelURL:
    """The Sentinels' addresses, and the master's db and credentials (from the first entry)."""
    hosts: list[tuple[str, int]] = []
    first = None
    for part in filter(None, (p.strip() for p in url.split(SENTINEL_SEPARATOR))):
        if not is_sentinel(part):
            raise ValueError("every entry must start with sentinel://")
        parsed = urlsplit(part)
        if not parsed.hostname:
            raise ValueError("a sentinel:// entry has no host")
        hosts.append((parsed.hostname, parsed.port or DEFAULT_SENTINEL_PORT))
        first = first or parsed
    if first is None:
        raise ValueError("no sentinel:// entry")
    path = first.path.strip("/")
    if path and not path.isdigit():
        raise ValueError("the database must be a number")
    return SentinelURL(hosts=tuple(hosts), db=int(path or 0),
                       username=unquote(first.username) if first.username else None,
                       password=unquote(first.password) if first.password else None)


_URL_PASSWORD = re.compile(r"(://[^:@/;]*:)[^;]*@")  # each user:password@ of a URL list (greedy: a raw @ in it)
URL_PASSWORD_MASK = "***"


def shown_url(url: str) -> str:
    """``url`` fit to print: every password in it (each Sentinel's too) replaced by ``***``."""
    return _URL_PASSWORD.sub(rf"\g<1>{URL_PASSWORD_MASK}@", url)


def redis_settings() -> RedisSettings:
    """The environment's Redis settings (``ConfigError`` naming a bad variable)."""
    return load_settings(RedisSettings)


def _master_name(master_name: str | None) -> str:
    name = master_name or redis_settings().sentinel_master
    assert name, "RedisSettings requires REDIS_SENTINEL_MASTER with a sentinel:// URL"
    return name


def _sentinel_args(url: str) -> tuple[SentinelURL, dict[str, Any]]:
    parsed = parse_sentinel_url(url)
    master_kwargs = {"db": parsed.db, "username": parsed.username, "password": parsed.password,
                     "socket_connect_timeout": SOCKET_CONNECT_TIMEOUT_S}
    return parsed, master_kwargs


def tls_failure(exc: BaseException) -> str | None:
    """Why TLS failed under a Redis client's error, in words that say what to change; None if it did not.

    redis-py reports a refused certificate as a ``ConnectionError`` like any unreachable server, so an
    operator told only "cannot reach REDIS_URL" would look for a Redis that is up and answering.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return (f"its TLS certificate was refused ({seen.verify_message}): name the CA that signed it in "
                    "REDIS_SSL_CA_CERTS, or set REDIS_SSL_CERT_REQS=none as Heroku Redis documents")
        if isinstance(seen, ssl.SSLError) or "handshake operation timed out" in str(seen):
            return (f"the TLS handshake failed ({seen}): a rediss:// REDIS_URL needs a server that speaks TLS "
                    "on that port")
        seen = seen.__cause__ or seen.__context__
    return None


def _url_options(url: str) -> dict[str, Any]:
    if url.startswith("rediss://"):
        return redis_settings().tls_options
    return {}


def sync_client(url: str | None = None, *, master_name: str | None = None, **options: Any) -> redis.Redis:
    """A blocking client for ``url`` (default ``REDIS_URL``): one server, or the master behind Sentinels.

    A Sentinel client asks for the current master on every new connection and drops its pool
    when a connection fails or the server answers READONLY, so after a failover the next
    command reaches the promoted replica.
    """
    url = url or redis_settings().redis_url
    if is_sentinel(url):
        parsed, master_kwargs = _sentinel_args(url)
        sentinels = redis.sentinel.Sentinel(list(parsed.hosts),
                                            sentinel_kwargs={"socket_timeout": SENTINEL_SOCKET_TIMEOUT_S})
        return sentinels.master_for(_master_name(master_name), **{**dead_peers.redis_options(), **master_kwargs,
                                                                  **options})
    return redis.Redis.from_url(url, **{**dead_peers.redis_options(), **_url_options(url), **options})


def async_client(url: str | None = None, *, master_name: str | None = None, **options: Any) -> aioredis.Redis:
    """An asyncio client for ``url`` (default ``REDIS_URL``), Sentinel-aware like :func:`sync_client`."""
    url = url or redis_settings().redis_url
    if is_sentinel(url):
        parsed, master_kwargs = _sentinel_args(url)
        sentinels = aiosentinel.Sentinel(list(parsed.hosts),
                                         sentinel_kwargs={"socket_timeout": SENTINEL_SOCKET_TIMEOUT_S})
        return sentinels.master_for(_master_name(master_name), **{**dead_peers.redis_options(), **master_kwargs,
                                                                  **options})
    return aioredis.Redis.from_url(url, **{**dead_peers.redis_options(), **_url_options(url), **options})
