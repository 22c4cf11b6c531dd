"""``StravaProvider``: the Strava API behind the provider interface (contract §4–§9b)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection
from datetime import datetime
from typing import Any

import httpx
from pydantic import ValidationError

from workers.config import load_settings
from workers.providers.base import AUTH_OAUTH2, Provider
from workers.providers.context import ProviderContext
from workers.providers.errors import (
    ProviderError,
    ProviderNotFound,
    ProviderPermanentError,
    ProviderRateLimited,
)
from workers.providers.kinds import FETCH_SOURCE, IMPORT_GEAR, PARSE_BLOB, RECONCILE
from workers.providers.models import (
    NO_POOL,
    AccountJob,
    ActivityRef,
    Capabilities,
    DiscoverItem,
    DiscoverReply,
    DiscoverRequest,
    FetchJob,
    FetchOutcome,
    OAuthTokens,
    PoolIdentity,
    RawArchive,
)
from workers.providers.strava import client as api
from workers.providers.strava import photos as strava_photos
from workers.providers.strava.cache import BoundedCache
from workers.providers.strava.dataset import (
    CONTENT_TYPE,
    DATASET_VERSION,
    PARSER_VERSION,
    PROVIDER,
    build_archive,
    parse_dataset,
)
from workers.providers.strava.mapping import ingest_problems, map_activity, map_gear, parse_time
from workers.providers.strava.models import StravaActivity, StravaGear, StravaSummaryActivity
from workers.providers.strava.segments import SegmentCache, fetch_segments
from workers.providers.strava.settings import StravaSettings
from workers.providers.strava.usage import RATE_WINDOWS, SHORT_WINDOW, WEBHOOK_WINDOW
from workers.providers.strava.webhooks import StravaWebhookRules
from workers.providers.webhooks import WEBHOOK_REASON
from workers.providers.windows import RateWindow

log = logging.getLogger(__name__)

RECONCILE_PER_PAGE = 100
DISCOVER_PER_PAGE = 200
DISCOVER_MAX_PAGES = 25
SCOPES = ("read", "activity:read_all", "profile:read_all")  # profile:read_all lists bikes and shoes
ACTIVITY_URL_TEMPLATE = "https://www.strava.com/activities/{id}"
SETUP_DOCS_URL = "https://developers.strava.com/docs/getting-started/"
DISCOVER_RATE_LIMITED_ERROR = "rate_limited: provider budget exhausted, try again shortly"


class StravaProvider(Provider):
    """Stateless apart from a small per-account gear cache (saves budget: most rides share a bike).

    Reference §3.6 and §3.10–3.13; webhooks live in ``webhooks.py``."""

    name = PROVIDER
    dataset_version = DATASET_VERSION
    parser_version = PARSER_VERSION

    def __init__(self, settings: StravaSettings | None = None, *, pool: PoolIdentity = NO_POOL) -> None:
        self.settings = settings or load_settings(StravaSettings)
        self.pool = pool
        self._gear_cache: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
        self._gear_lock = threading.Lock()
        self.segment_cache = SegmentCache(self.settings.segment_cache_max_entries,
                                          self.settings.segment_cache_ttl_s)
        self.mirrored_photos = BoundedCache(strava_photos.MIRROR_CACHE_MAX_ENTRIES,
                                            strava_photos.MIRROR_CACHE_TTL_S)
        self._webhooks = StravaWebhookRules()

    @classmethod
    def from_settings(cls, settings: object | None, pool: PoolIdentity) -> StravaProvider:
        """Registry factory: ``StravaSettings``, or ``CAIRN_STRAVA_*`` read from the environment."""
        strava = settings if isinstance(settings, StravaSettings) else load_settings(StravaSettings)
        return cls(strava, pool=pool)

    # ------------------------------------------------------------------ declarations

    def declared_capabilities(self) -> Capabilities:
        activity = {"read": True, "write": False, "backfill": True, "granularity": "per-activity"}
        return Capabilities(
            jobs=frozenset({FETCH_SOURCE, RECONCILE, PARSE_BLOB, IMPORT_GEAR}),
            data_types={"Activity": activity,
                        "Lap": {"read": True, "write": False, "backfill": True},
                        "Segment": {"read": True, "write": False, "backfill": True},
                        "SegmentEffort": {"read": True, "write": False, "backfill": True},
                        "Gear": {"read": True, "write": False, "backfill": False}},
        )

    def manifest_meta(self) -> dict[str, Any]:
        return {
            "display_name": "Strava",
            "activity_url_template": ACTIVITY_URL_TEMPLATE,
            "setup_docs_url": SETUP_DOCS_URL,
            "auth_method": AUTH_OAUTH2,
            "oauth": {"authorize_url": self.settings.authorize_url, "scopes": list(SCOPES),
                      "scope_separator": ",", "pkce": False,
                      "authorize_params": {"approval_prompt": "force"}},
            "config_fields": [
                {"key": "client_id", "label": "Client ID",
                 "help": "From https://www.strava.com/settings/api (your API application)."},
                {"key": "client_secret", "label": "Client secret", "secret": True},
            ],
        }

    def rate_windows(self) -> tuple[RateWindow, ...]:
        """15-minute and daily read budgets per app, and the webhook fetches' own window."""
        return RATE_WINDOWS

    def bucket_for(self, reason: str) -> str:
        """Webhook fetches spend the ``webhook`` window, so a burst of events cannot starve
        reconciles and backfills of the ``short`` one; every call also spends ``daily``."""
        return WEBHOOK_WINDOW if reason == WEBHOOK_REASON else SHORT_WINDOW

    def webhook_rules(self) -> StravaWebhookRules:
        """Push subscriptions (``webhooks.py``): on when ``CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN`` is set;
        read once per provider, so a bad ``CAIRN_STRAVA_WEBHOOK_*`` fails where the provider is built."""
        return self._webhooks

    def new_http_client(self) -> httpx.Client:
        return api.new_http_client()

    def _client(self, ctx: ProviderContext) -> api.StravaClient:
        return api.StravaClient(ctx.http, ctx.access_token, base_url=self.settings.base_url,
                                rate_limit=ctx.rate_limit, bucket=ctx.bucket or self.bucket_for(""))

    # ------------------------------------------------------------------ activities

    def fetch_source(self, ctx: ProviderContext, job: FetchJob) -> FetchOutcome:
        """Activity detail, streams (404 = none), gear (best effort, cached per account), photos mirrored
        into core's blob store (best effort, ``photos.py``) and with ``fetch_streams`` each segment's detail
        (a rate limit re-runs the job after the window, ``segments.py``); archived as dataset 1, then parsed
        *from that archive*: GEAR + ACTIVITY for the first result, SEGMENT + SEGMENT_EFFORT for the second."""
        ext_id = str(job.ext_id or "").strip()
        if not ext_id:
            raise ProviderPermanentError("fetch_source without ext_id", code="missing_ext_id")
        client = self._client(ctx)
        activity = client.get_activity(ext_id)
        streams = client.get_streams(ext_id) if job.fetch_streams else None
        gear, gear_errors = [], 0
        gear_id = _gear_id(activity)
        if gear_id:
            try:
                gear.append(self._cached_gear(client, job.account_id, gear_id))
            except ProviderError as exc:  # gear is optional data (contract §5)
                gear_errors = 1
                log.warning("strava gear %s lookup skipped: %s", gear_id, type(exc).__name__)
        photos: list[dict[str, Any]] = []
        photo_errors, segments = 0, None
        mappable = _mappable(activity)  # an activity core cannot ingest gets no photos or segments
        if ctx.blobs is not None and mappable:  # no sink (a parser-only context): no listing call
            listed, source = strava_photos.candidates(client, activity, ext_id)
            photos, photo_errors = strava_photos.archive_entries(ctx.http, ctx.blobs, job.user_id, listed,
                                                                 source, self.mirrored_photos)
        if job.fetch_streams and mappable:
            segments = fetch_segments(client, activity, self.segment_cache, job.account_id)
        body = build_archive(activity, streams, gear, segments=segments.details if segments else None,
                             photos=photos, worker_name=self.pool.worker_name,
                             worker_version=self.parser_version, package=self.pool.package)
        outcome = self.parse_blob(body, job)
        outcome.archive = RawArchive(body, DATASET_VERSION, CONTENT_TYPE)
        outcome.gear_errors, outcome.photo_errors = gear_errors, photo_errors
        if segments is not None:
            outcome.segment_errors, outcome.rate_limited = segments.errors, segments.rate_limited
        return outcome

    def parse_blob(self, raw: bytes, job: FetchJob) -> FetchOutcome:
        """The same parser over a downloaded archive."""
        parsed = parse_dataset(raw, user_id=job.user_id, account_id=job.account_id,
                               ext_id=str(getattr(job, "ext_id", "") or ""))
        return FetchOutcome(ext_id=parsed.ext_id, wire_events=parsed.events,
                            segment_events=parsed.segment_events)

    def _cached_gear(self, client: api.StravaClient, account_id: str, gear_id: str) -> dict[str, Any]:
        key, now = (account_id, gear_id), time.monotonic()
        with self._gear_lock:
            hit = self._gear_cache.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
        gear = client.get_gear(gear_id)
        with self._gear_lock:
            self._gear_cache[key] = (now + self.settings.gear_cache_ttl_s, gear)
        return gear

    def list_activities(self, ctx: ProviderContext, after: datetime | None,
                        before: datetime | None = None, limit: int | None = None,
                        exclude: Collection[str] = (), *,
                        per_page: int = RECONCILE_PER_PAGE) -> list[ActivityRef]:
        """Walk pages until an empty or short page, or until ``limit`` new ids are found."""
        client, found, excluded = self._client(ctx), [], set(exclude)
        page = 1
        while True:
            rows = client.list_activities(page=page, per_page=per_page, after=_unix(after),
                                          before=_unix(before))
            for ref in _refs(rows):
                if ref.ext_id in excluded:
                    continue
                found.append(ref)
                if limit is not None and len(found) >= limit:
                    return found
            if len(rows) < per_page:
                return found
            page += 1

    def discover(self, ctx: ProviderContext, request: DiscoverRequest) -> DiscoverReply:
        """Contract §8 / reference §3.11: only an empty page means complete."""
        client = self._client(ctx)
        items: list[DiscoverItem] = []
        page = max(request.start_page, 1)
        for _ in range(DISCOVER_MAX_PAGES):
            try:
                rows = client.list_activities(page=page, per_page=DISCOVER_PER_PAGE)
            except ProviderRateLimited:
                if not items:
                    return DiscoverReply(error=DISCOVER_RATE_LIMITED_ERROR)
                return DiscoverReply(items=items, next_page=page, rate_limited=True)
            except ProviderError as exc:
                if not items:
                    return DiscoverReply(error=f"{exc.code}: {exc}")
                return DiscoverReply(items=items, next_page=page)
            if not rows:
                return DiscoverReply(items=items, complete=True)
            for row in rows:
                summary = StravaSummaryActivity.model_validate(row)
                if summary.id:
                    items.append(DiscoverItem(external_id=str(summary.id), item_time=summary.start_date))
            page += 1
        return DiscoverReply(items=items, next_page=page)

    # ------------------------------------------------------------------ gear

    def import_gear(self, ctx: ProviderContext, job: AccountJob) -> list[dict[str, Any]]:
        """One GEAR event per bike and shoe on the athlete, retired included."""
        client = self._client(ctx)
        athlete = client.get_athlete()
        events = []
        for summary in list(athlete.get("bikes") or []) + list(athlete.get("shoes") or []):
            if not isinstance(summary, dict) or not summary.get("id"):
                continue
            try:
                detail = client.get_gear(str(summary["id"]))
            except ProviderNotFound:
                detail = {}
            gear = StravaGear.model_validate({**summary, **detail})
            ref = {"userId": job.user_id, "provider": PROVIDER, "externalId": gear.id}
            if job.account_id:
                ref["externalAccountId"] = job.account_id
            events.append({"type": "WORKER_EVENT_TYPE_GEAR",
                           "gear": {"ref": ref, "payload": map_gear(gear)}})
        return events

    # ------------------------------------------------------------------ OAuth

    def exchange_oauth(self, http: httpx.Client, *, client_id: str, client_secret: str,
                       code: str, redirect_uri: str,
                       code_verifier: str | None = None) -> OAuthTokens:
        """Contract §9b. Strava ignores ``redirect_uri`` at exchange (checked at authorize)."""
        body = api.exchange_code(http, token_url=self.settings.effective_token_url,
                                 client_id=client_id, client_secret=client_secret, code=code,
                                 code_verifier=code_verifier)
        athlete = body["athlete"] if isinstance(body.get("athlete"), dict) else {}
        athlete_id = athlete.get("id")
        if not athlete_id:  # not in the reply: ask the API with the fresh token
            athlete_id = api.StravaClient(http, body["access_token"],
                                          base_url=self.settings.base_url).get_athlete().get("id")
        if not athlete_id:
            raise ProviderPermanentError("token reply names no athlete", code="exchange_failed")
        return OAuthTokens(access_token=body["access_token"],
                           refresh_token=str(body.get("refresh_token") or ""),
                           expires_at=api.token_expiry(body), scope=str(body.get("scope") or ""),
                           token_type=str(body.get("token_type") or "Bearer"),
                           provider_account_id=str(athlete_id))

    def refresh_oauth(self, http: httpx.Client, *, client_id: str, client_secret: str,
                      refresh_token: str) -> OAuthTokens:
        """Refresh an access token; an absent new refresh token keeps the old one."""
        body = api.exchange_code(http, token_url=self.settings.effective_token_url,
                                 client_id=client_id, client_secret=client_secret,
                                 code=refresh_token, grant_type="refresh_token")
        athlete = body["athlete"] if isinstance(body.get("athlete"), dict) else {}
        return OAuthTokens(access_token=body["access_token"],
                           refresh_token=str(body.get("refresh_token") or refresh_token),
                           expires_at=api.token_expiry(body), scope=str(body.get("scope") or ""),
                           token_type=str(body.get("token_type") or "Bearer"),
                           provider_account_id=str(athlete.get("id") or ""))


def _mappable(activity: dict[str, Any]) -> bool:
    """Whether core could ingest the activity (the parser raises ``UnmappableActivity`` otherwise)."""
    try:
        return not ingest_problems(map_activity(StravaActivity.model_validate(activity)))
    except ValidationError:
        return False


def _gear_id(activity: dict[str, Any]) -> str:
    gear = activity["gear"] if isinstance(activity.get("gear"), dict) else {}
    value = activity.get("gear_id") or gear.get("id") or ""
    return str(value)


def _unix(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value is not None else None


def _refs(rows: list[Any]) -> list[ActivityRef]:
    refs = []
    for row in rows:
        summary = StravaSummaryActivity.model_validate(row if isinstance(row, dict) else {})
        start = parse_time(summary.start_date)
        if summary.id and start is not None:
            refs.append(ActivityRef(ext_id=str(summary.id), start_time=start))
    return refs

