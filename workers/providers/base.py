"""The provider interface: everything the Cairn bridge, tasks and handlers may ask of a provider."""

from __future__ import annotations

import abc
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, Self

import httpx

from workers.providers.context import DEFAULT_BUCKET, ProviderContext
from workers.providers.errors import ProviderPermanentError
from workers.providers.models import (
    NO_POOL,
    AccountJob,
    ActivityRef,
    Capabilities,
    DiscoverReply,
    DiscoverRequest,
    FetchJob,
    FetchOutcome,
    MetricsJob,
    OAuthTokens,
    PoolIdentity,
)
from workers.providers.webhooks import WebhookRules
from workers.providers.windows import RateWindow

# The manifest's ``auth_method`` (contract §1): how a pool's jobs get their credentials (§9).
AUTH_OAUTH2 = "oauth2"  # an access token per job from cairn.tokens.<provider>.get (Strava)
AUTH_CREDENTIALS = "credentials"  # the connection's login per job from cairn.creds.<provider>.get (Garmin)


class Provider(abc.ABC):
    """One provider API behind the contract's job kinds. Stateless between calls.

    Everything provider-specific (HTTP API, rate windows, sport tables, archive format) lives
    in one sub-package behind this class, so the bridge and handlers serve any provider
    unchanged; the contract parts reach a provider only through ``ProviderContext``, and nothing
    under ``workers/providers`` imports ``workers/cairn`` (tests/meta/test_imports.py). Every method
    the generic code calls is declared here, with a default where optional: no ``hasattr``.

    ``name`` is the provider token of every subject (``CAIRN_PROVIDER``);
    ``parser_version`` (``N.M``) is what results, presence and the manifest
    carry, ``dataset_version`` the ``N`` of the raw archives it writes.
    """

    name: str
    dataset_version: int
    parser_version: str
    archive_content_type: str = "application/json"  # the raw archive's type (parse_blob names it again)
    pool: PoolIdentity = NO_POOL  # the pool this instance serves (``from_settings`` sets it)

    @classmethod
    def from_settings(cls, settings: Any | None, pool: PoolIdentity) -> Self:
        """Build the provider for ``pool``. ``settings`` is the pool's ``CairnSettings``; a provider
        reads its own ``CAIRN_<NAME>_*`` settings itself. The registry derives ``pool`` once."""
        provider = cls()
        provider.pool = pool
        return provider

    # ------------------------------------------------------------------ declarations

    @abc.abstractmethod
    def declared_capabilities(self) -> Capabilities:
        """Job kinds and data types this provider really serves."""

    @abc.abstractmethod
    def manifest_meta(self) -> dict[str, Any] | None:
        """The manifest's ``provider_meta`` (None for parser-only pools)."""

    def auth_method(self) -> str:
        """How jobs authenticate: ``oauth2`` (tokens from ``cairn.tokens.<p>.get``) or
        ``credentials`` (a login from ``cairn.creds.<p>.get``), as the manifest declares it.

        A pool without ``provider_meta`` (links no accounts itself) uses core's token store.
        """
        return str((self.manifest_meta() or {}).get("auth_method") or AUTH_OAUTH2)

    def rate_windows(self) -> Sequence[RateWindow]:
        """The budget windows of one provider app, kept in the shared ``cairn_rate_limits`` KV.

        Default none: a window a provider reserves without declaring it is unlimited.
        """
        return ()

    def bucket_for(self, reason: str) -> str:
        """The short-term window a job spends, from the job's ``reason`` (``webhook``,
        ``backfill``, ``""`` for jobs without one). Becomes ``ProviderContext.bucket``."""
        return DEFAULT_BUCKET

    def webhook_rules(self) -> WebhookRules | None:
        """The provider's webhook rules (handshake, event meaning), or None: the pool takes no webhooks.

        The bridge consumes the pool's webhook events and answers the handshake only
        with rules, and presence says ``webhooks: true`` only when they are enabled.
        """
        return None

    @abc.abstractmethod
    def new_http_client(self) -> httpx.Client:
        """An HTTP client configured for this provider (one per process, reused)."""

    # ------------------------------------------------------------------ activities

    @abc.abstractmethod
    def fetch_source(self, ctx: ProviderContext, job: FetchJob) -> FetchOutcome:
        """Fetch one activity (and streams) and map it; never fails on gear."""

    @abc.abstractmethod
    def parse_blob(self, raw: bytes, job: FetchJob) -> FetchOutcome:
        """Re-parse an archive: the same events the import produced, byte for byte."""

    @abc.abstractmethod
    def list_activities(self, ctx: ProviderContext, after: datetime | None,
                        before: datetime | None = None, limit: int | None = None,
                        exclude: Collection[str] = ()) -> list[ActivityRef]:
        """Activities started in ``[after, before)``; ``limit`` counts non-excluded ones."""

    @abc.abstractmethod
    def discover(self, ctx: ProviderContext, request: DiscoverRequest) -> DiscoverReply:
        """One discover round (contract §8); errors and rate limits are in the reply."""

    # ------------------------------------------------------------------ account data

    def import_gear(self, ctx: ProviderContext, job: AccountJob) -> list[dict[str, Any]]:
        """GEAR ``WorkerEvent`` dicts for every gear of the account, retired included.

        Only called when ``IMPORT_GEAR`` is declared in ``declared_capabilities``.
        """
        raise NotImplementedError(f"{self.name} does not serve import_gear")

    def import_metrics(self, ctx: ProviderContext, job: MetricsJob) -> list[dict[str, Any]]:
        """METRIC ``WorkerEvent`` dicts for the job's period.

        Only called when ``IMPORT_METRICS`` is declared in ``declared_capabilities``.
        """
        raise NotImplementedError(f"{self.name} does not serve import_metrics")

    # ------------------------------------------------------------------ OAuth

    def exchange_oauth(self, http: httpx.Client, *, client_id: str, client_secret: str,
                       code: str, redirect_uri: str,
                       code_verifier: str | None = None) -> OAuthTokens:
        """Exchange an authorization code; the reply names the provider account id.

        Required when ``manifest_meta()`` says ``auth_method: oauth2``; a provider that
        links no OAuth accounts refuses (the §9b reply ``exchange_failed``).
        """
        raise ProviderPermanentError(f"{self.name} links no OAuth accounts", code="unsupported")

    def refresh_oauth(self, http: httpx.Client, *, client_id: str, client_secret: str,
                      refresh_token: str) -> OAuthTokens | None:
        """New tokens for an expired access token, or None when this provider cannot refresh
        (the stored token is then used as it is; the provider answers 401 if it is dead)."""
        return None
