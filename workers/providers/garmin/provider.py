"""``GarminProvider``: Garmin Connect behind the provider interface (a credentials pool).

What it does per job kind (contract §4–§9, issue 16 §2):

* fetch_source — the activity's Connect summary
  (``/activity-service/activity/<id>``), its gear (``/gear-service/gear/filterGear``,
  best effort: a failed lookup never fails or delays the import), and the
  original file (``/download-service/files/activity/<id>``, a zip with the FIT
  inside); the dataset-1 archive of all three; then the events parsed *from
  that archive*: GEAR, then the ACTIVITY with its laps and record stream.
* parse_blob — the same parser over a downloaded archive, byte for byte.
* reconcile — ``list_activities`` over the window, pages of 100 from
  ``/activitylist-service/activities/search/activities`` (newest first).
* discover — up to 10 pages of 100 per round, partial replies on rate limits.

Authentication is ``credentials``: each job brings the connection's login
(``ProviderContext.login``, fetched fresh from ``cairn.creds.garmin.get``);
``session.GarminSessions`` keeps the resulting garth session in memory per
account. Nothing here is OAuth: ``exchange_oauth`` keeps the interface's
refusal, and no import_gear or import_metrics consumer is declared.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from workers.config import load_settings
from workers.providers.base import AUTH_CREDENTIALS, Provider
from workers.providers.context import ProviderContext
from workers.providers.errors import ProviderError, ProviderPermanentError, ProviderRateLimited
from workers.providers.garmin.dataset import (
    CONTENT_TYPE,
    DATASET_VERSION,
    PARSER_VERSION,
    PROVIDER,
    build_archive,
    parse_dataset,
)
from workers.providers.garmin.fit import fit_from_download
from workers.providers.garmin.login_gate import LoginGate
from workers.providers.garmin.session import SHORT_WINDOW, GarminSessions, rate_windows
from workers.providers.garmin.settings import GarminSettings, check_environment
from workers.providers.kinds import FETCH_SOURCE, PARSE_BLOB, RECONCILE
from workers.providers.models import (
    NO_POOL,
    ActivityRef,
    Capabilities,
    DiscoverItem,
    DiscoverReply,
    DiscoverRequest,
    FetchJob,
    FetchOutcome,
    PoolIdentity,
    RawArchive,
)
from workers.providers.windows import RateWindow
from workers.redisconn import sync_client

log = logging.getLogger(__name__)

ACTIVITY_PATH = "/activity-service/activity/{id}"
GEAR_PATH = "/gear-service/gear/filterGear"
DOWNLOAD_PATH = "/download-service/files/activity/{id}"
LIST_PATH = "/activitylist-service/activities/search/activities"
RECONCILE_PER_PAGE = 100
DISCOVER_PER_PAGE = 100
DISCOVER_MAX_PAGES = 10
LIST_DATE_SLACK = timedelta(days=1)  # Connect filters startDate by the *local* date: ask a day earlier
GMT_FORMAT = "%Y-%m-%d %H:%M:%S"
ACTIVITY_URL_TEMPLATE = "https://connect.garmin.com/modern/activity/{id}"
SETUP_DOCS_URL = "https://support.garmin.com/en-US/?faq=uGHS8ZqOIhA0usBzBMdJu7"
DISPLAY_NAME = "Garmin Connect"
HTTP_TIMEOUT_S = 10.0
DISCOVER_RATE_LIMITED_ERROR = "rate_limited: provider budget exhausted, try again shortly"


class GarminProvider(Provider):
    """Stateless apart from the in-memory garth sessions (one per connected account)."""

    name = PROVIDER
    dataset_version = DATASET_VERSION
    parser_version = PARSER_VERSION
    archive_content_type = CONTENT_TYPE

    def __init__(self, settings: GarminSettings | None = None, *, pool: PoolIdentity = NO_POOL,
                 gate: LoginGate | None = None) -> None:
        self.settings = settings or load_settings(GarminSettings)
        self.pool = pool
        self.sessions = GarminSessions(self.settings, gate)

    @classmethod
    def from_settings(cls, settings: object | None, pool: PoolIdentity) -> GarminProvider:
        """Registry factory: ``CAIRN_GARMIN_*`` settings, checked against the environment at start; logins
        single-flight across the pool's hosts through the fleet's Redis (``login_gate``)."""
        garmin = settings if isinstance(settings, GarminSettings) else load_settings(GarminSettings)
        check_environment(garmin)
        return cls(garmin, pool=pool, gate=LoginGate(sync_client()))

    # ------------------------------------------------------------------ declarations

    def declared_capabilities(self) -> Capabilities:
        activity = {"read": True, "write": False, "backfill": True, "granularity": "per-activity"}
        return Capabilities(jobs=frozenset({FETCH_SOURCE, RECONCILE, PARSE_BLOB}),
                            data_types={"Activity": activity,
                                        "Lap": {"read": True, "write": False, "backfill": True}})

    def manifest_meta(self) -> dict[str, Any]:
        return {
            "display_name": DISPLAY_NAME,
            "activity_url_template": ACTIVITY_URL_TEMPLATE,
            "setup_docs_url": SETUP_DOCS_URL,
            "auth_method": AUTH_CREDENTIALS,
            "config_fields": [
                {"key": "client_id", "label": "Garmin Connect email",
                 "help": "The email you sign in to connect.garmin.com with."},
                {"key": "client_secret", "label": "Garmin Connect password", "secret": True,
                 "help": "Accounts with two-step verification cannot be imported in the background."},
            ],
        }

    def rate_windows(self) -> tuple[RateWindow, ...]:
        """Conservative per-account windows (Garmin publishes none): see ``session.rate_windows``."""
        return rate_windows(self.settings)

    def bucket_for(self, reason: str) -> str:
        return SHORT_WINDOW

    def new_http_client(self) -> httpx.Client:
        """The interface's pooled client; Garmin's calls go through garth's requests session instead."""
        return httpx.Client(timeout=HTTP_TIMEOUT_S)

    # ------------------------------------------------------------------ activities

    def fetch_source(self, ctx: ProviderContext, job: FetchJob) -> FetchOutcome:
        ext_id = str(job.ext_id or "").strip()
        if not ext_id.isdigit():  # Connect ids are numbers; anything else never names an activity
            raise ProviderPermanentError(f"not a Garmin activity id: {ext_id[:40]!r}", code="missing_ext_id")
        summary = self.sessions.connectapi(ctx, ACTIVITY_PATH.format(id=ext_id))
        gear, gear_errors = self._gear(ctx, ext_id)
        fit = fit_from_download(self.sessions.download(ctx, DOWNLOAD_PATH.format(id=ext_id)))
        body = build_archive(ext_id, summary if isinstance(summary, dict) else {}, gear, fit,
                             worker_name=self.pool.worker_name, worker_version=self.parser_version,
                             package=self.pool.package)
        outcome = self.parse_blob(body, job)
        outcome.archive = RawArchive(body, DATASET_VERSION, CONTENT_TYPE)
        outcome.gear_errors = gear_errors
        return outcome

    def _gear(self, ctx: ProviderContext, ext_id: str) -> tuple[list[dict[str, Any]], int]:
        try:
            found = self.sessions.connectapi(ctx, GEAR_PATH, {"activityId": ext_id})
        except ProviderError as exc:  # gear is optional data (contract §5)
            log.warning("garmin gear lookup for %s skipped: %s", ext_id, type(exc).__name__)
            return [], 1
        return [g for g in found or [] if isinstance(g, dict)], 0

    def parse_blob(self, raw: bytes, job: FetchJob) -> FetchOutcome:
        parsed = parse_dataset(raw, user_id=job.user_id, account_id=job.account_id,
                               ext_id=str(getattr(job, "ext_id", "") or ""))
        return FetchOutcome(ext_id=parsed.ext_id, wire_events=parsed.events)

    def _page(self, ctx: ProviderContext, start: int, limit: int,
              after: datetime | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"start": start, "limit": limit}
        if after is not None:
            params["startDate"] = (after - LIST_DATE_SLACK).astimezone(UTC).date().isoformat()
        rows = self.sessions.connectapi(ctx, LIST_PATH, params)
        return [r for r in rows or [] if isinstance(r, dict)]

    def list_activities(self, ctx: ProviderContext, after: datetime | None,
                        before: datetime | None = None, limit: int | None = None,
                        exclude: Collection[str] = ()) -> list[ActivityRef]:
        """Newest first, page by page, until a short page or ``limit`` new ids in the window."""
        found, excluded, start = [], set(exclude), 0
        while True:
            rows = self._page(ctx, start, RECONCILE_PER_PAGE, after)
            for ref in _refs(rows):
                if ref.ext_id in excluded or (after is not None and ref.start_time < after) \
                        or (before is not None and ref.start_time >= before):
                    continue
                found.append(ref)
                if limit is not None and len(found) >= limit:
                    return found
            if len(rows) < RECONCILE_PER_PAGE:
                return found
            start += RECONCILE_PER_PAGE

    def discover(self, ctx: ProviderContext, request: DiscoverRequest) -> DiscoverReply:
        """Contract §8: pages of 100 from ``start_page``; only a short page means complete."""
        items: list[DiscoverItem] = []
        page = max(request.start_page, 1)
        for _ in range(DISCOVER_MAX_PAGES):
            try:
                rows = self._page(ctx, (page - 1) * DISCOVER_PER_PAGE, DISCOVER_PER_PAGE)
            except ProviderRateLimited:
                if not items:
                    return DiscoverReply.failed(DISCOVER_RATE_LIMITED_ERROR)
                return DiscoverReply(items=items, next_page=page, rate_limited=True)
            except ProviderError as exc:
                if not items:
                    return DiscoverReply.failed(f"{exc.code}: {exc}")
                return DiscoverReply(items=items, next_page=page)
            items += [DiscoverItem(external_id=r.ext_id, item_time=r.start_time) for r in _refs(rows)]
            if len(rows) < DISCOVER_PER_PAGE:
                return DiscoverReply(items=items, complete=True)
            page += 1
        return DiscoverReply(items=items, next_page=page)


def parse_gmt(value: Any) -> datetime | None:
    """Connect's ``startTimeGMT`` (``2026-07-01 06:00:00``, UTC without a zone) → aware UTC."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.strptime(value[:19], GMT_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None


def _refs(rows: list[dict[str, Any]]) -> list[ActivityRef]:
    refs = []
    for row in rows:
        start = parse_gmt(row.get("startTimeGMT"))
        if row.get("activityId") and start is not None:
            refs.append(ActivityRef(ext_id=str(row["activityId"]), start_time=start))
    return refs
