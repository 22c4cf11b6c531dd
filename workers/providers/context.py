"""``ProviderContext``: what one provider call may use: a token, an HTTP client, the budget."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Protocol, runtime_checkable

import httpx

from workers.logs import register_secret
from workers.providers.windows import NullRateLimitHook, RateLimitHook

DEFAULT_BUCKET = ""  # "the provider's default window": ``Provider.bucket_for("")``
FINGERPRINT_HEX_CHARS = 16


@dataclasses.dataclass(frozen=True)
class Login:
    """A credentials connection's two slots (contract §9: ``cairn.creds.<provider>.get``).

    For an ``auth_method: credentials`` provider (Garmin) the connection's
    ``client_id``/``client_secret`` slots hold the user's login. They come
    fresh per job, live only here (``repr`` hides both, the redactor knows
    them) and are never written anywhere. ``fingerprint`` names the pair
    without revealing it, so a provider can key an in-memory session by it and
    notice when the user re-connected with another password.
    """

    username: str = dataclasses.field(repr=False)
    password: str = dataclasses.field(repr=False)

    def __post_init__(self) -> None:
        register_secret(self.username)
        register_secret(self.password)

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256(f"{self.username}\0{self.password}".encode()).hexdigest()
        return digest[:FINGERPRINT_HEX_CHARS]


@runtime_checkable
class BlobSink(Protocol):
    """Durable blob upload through core's presign (contract §5; the worker holds no S3 keys).

    ``upload`` stores ``body`` under the user's layout (``users/<user>/<provider>/…``)
    with its real content type and returns core's ``blob_id`` verbatim. Failures
    raise a ``RetryableJobError`` (presign or PUT refused); a caller that treats
    the blob as optional (a mirrored photo) skips it.
    """

    def upload(self, body: bytes, content_type: str, user_id: str) -> str: ...


@dataclasses.dataclass
class ProviderContext:
    """One job's view of the world. ``bucket`` is the short-term window the job spends,
    chosen by the provider from the job's reason (``Provider.bucket_for``); empty means
    the provider's default. An OAuth provider gets ``access_token``; a credentials
    provider gets ``login`` instead (``Provider.auth_method()`` decides which).

    The contract layer owns token RPCs, the HTTP client and the shared budget; a provider
    reaches them only here, so it never imports NATS. The token is fetched per job (contract
    §9), hidden from ``repr`` and registered with the redactor."""

    access_token: str = dataclasses.field(repr=False)
    http: httpx.Client
    rate_limit: RateLimitHook = dataclasses.field(default_factory=NullRateLimitHook)
    bucket: str = DEFAULT_BUCKET
    blobs: BlobSink | None = None  # mirrored media (photos); None: nothing is mirrored
    login: Login | None = None  # credentials providers: the connection's login (access_token is "")
    account_id: str = ""  # the Cairn account the job is for (a provider's in-memory session key)

    def __post_init__(self) -> None:
        register_secret(self.access_token)
