"""The Strava HTTP API (v3) and OAuth token endpoint over httpx."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import httpx

from workers.logs import register_secret
from workers.providers.errors import (
    ProviderAuthError,
    ProviderNotFound,
    ProviderPermanentError,
    ProviderTransientError,
)
from workers.providers.strava.usage import DAILY_WINDOW, SHORT_WINDOW, parse_usage, rate_limited_from_429
from workers.providers.windows import NullRateLimitHook, RateLimitHook

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://www.strava.com"
API_PREFIX = "/api/v3"
TOKEN_PATH = "/oauth/token"
AUTHORIZE_PATH = "/oauth/authorize"
API_TIMEOUT_S = 30.0
TOKEN_TIMEOUT_S = 15.0
USER_AGENT = "switchyard-strava-worker"
MAX_PER_PAGE = 200
STREAM_KEYS = ("time", "latlng", "altitude", "distance", "velocity_smooth", "heartrate",
               "cadence", "watts", "temp", "grade_smooth")
TRANSIENT_STATUSES = frozenset({408, 425})


def new_http_client() -> httpx.Client:
    """One pooled client per process; no base URL so the same client serves API and OAuth."""
    return httpx.Client(timeout=API_TIMEOUT_S, headers={"User-Agent": USER_AGENT,
                                                        "Accept": "application/json"})


class StravaClient:
    """Authenticated API calls for one job; cheap to build, holds no state beyond the call.

    One ``_get`` reserves budget first, syncs the limiter from the usage headers of *every*
    response (429s included) and maps the status to a provider error (reference §3.6, §4.1), so
    no endpoint forgets one. The token travels only in the ``Authorization`` header and the
    client secret only in the token form body; errors name method, path and status only.
    """

    def __init__(self, http: httpx.Client, access_token: str, *, base_url: str = DEFAULT_BASE_URL,
                 rate_limit: RateLimitHook | None = None, bucket: str = SHORT_WINDOW) -> None:
        register_secret(access_token)
        self._http = http
        self._token = access_token
        self._api = base_url.rstrip("/") + API_PREFIX
        self._hook = rate_limit or NullRateLimitHook()
        self._windows: Sequence[str] = (DAILY_WINDOW, bucket)

    def __repr__(self) -> str:  # never show the token
        return f"StravaClient(api={self._api!r})"

    # ------------------------------------------------------------------ endpoints

    def list_activities(self, *, page: int, per_page: int, after: int | None = None,
                        before: int | None = None) -> list[dict[str, Any]]:
        """One page of ``GET /athlete/activities`` (summaries); pages start at 1."""
        params: dict[str, Any] = {"page": page, "per_page": min(per_page, MAX_PER_PAGE)}
        if after and after > 0:
            params["after"] = after
        if before and before > 0:
            params["before"] = before
        body = self._get("/athlete/activities", params)
        if not isinstance(body, list):
            raise ProviderTransientError("GET /athlete/activities: expected a JSON list")
        return body

    def get_activity(self, activity_id: str) -> dict[str, Any]:
        """``GET /activities/{id}`` with every segment effort (DetailedActivity)."""
        return self._object(f"/activities/{_safe_id(activity_id)}", {"include_all_efforts": "true"})

    def get_streams(self, activity_id: str) -> dict[str, Any] | None:
        """``GET /activities/{id}/streams`` keyed by type; None when Strava has none (404)."""
        params = {"keys": ",".join(STREAM_KEYS), "key_by_type": "true"}
        try:
            body = self._get(f"/activities/{_safe_id(activity_id)}/streams", params)
        except ProviderNotFound:
            return None
        if isinstance(body, list):  # key_by_type ignored by a server: re-key it ourselves
            body = {str(s.get("type")): s for s in body if isinstance(s, dict)}
        if not isinstance(body, dict):
            raise ProviderTransientError("GET streams: expected a JSON object")
        return body

    def get_segment(self, segment_id: str) -> dict[str, Any]:
        """``GET /segments/{id}`` (DetailedSegment: adds ``map.polyline``, ``total_elevation_gain``)."""
        return self._object(f"/segments/{_safe_id(segment_id)}", None)

    def get_photos(self, activity_id: str, size: int) -> list[dict[str, Any]]:
        """``GET /activities/{id}/photos?size=…&photo_sources=true``: urls and sizes keyed by ``size``."""
        body = self._get(f"/activities/{_safe_id(activity_id)}/photos",
                         {"size": size, "photo_sources": "true"})
        if not isinstance(body, list):
            raise ProviderTransientError("GET photos: expected a JSON list")
        return [p for p in body if isinstance(p, dict)]

    def get_gear(self, gear_id: str) -> dict[str, Any]:
        """``GET /gear/{id}`` (DetailedGear: name, brand, model, distance, retired …)."""
        return self._object(f"/gear/{_safe_id(gear_id)}", None)

    def get_athlete(self) -> dict[str, Any]:
        """``GET /athlete``: the token's athlete (id; bikes and shoes with profile:read_all)."""
        return self._object("/athlete", None)

    # ------------------------------------------------------------------ plumbing

    def _object(self, path: str, params: dict[str, Any] | None) -> dict[str, Any]:
        body = self._get(path, params)
        if not isinstance(body, dict):
            raise ProviderTransientError(f"GET {_path_only(path)}: expected a JSON object")
        return body

    def _get(self, path: str, params: dict[str, Any] | None) -> Any:
        self._hook.reserve(self._windows)
        try:
            response = self._http.get(self._api + path, params=params,
                                      headers={"Authorization": f"Bearer {self._token}"})
        except httpx.HTTPError as exc:
            raise ProviderTransientError(f"GET {_path_only(path)}: {type(exc).__name__}") from None
        self._hook.observe(parse_usage(response.headers), response.headers)
        check_status(response, f"GET {_path_only(path)}")
        try:
            return response.json()
        except ValueError:
            raise ProviderTransientError(f"GET {_path_only(path)}: undecodable JSON") from None


def check_status(response: httpx.Response, what: str) -> None:
    """Map a Strava status onto the provider error classes (reference §3.6 table)."""
    status = response.status_code
    if 200 <= status < 300:
        return
    if status == 429:
        raise rate_limited_from_429(response.headers)
    if status == 401:
        raise ProviderAuthError(f"{what}: 401 unauthorized")
    if status == 404:
        raise ProviderNotFound(f"{what}: 404 not found")
    if status >= 500 or status in TRANSIENT_STATUSES:
        raise ProviderTransientError(f"{what}: HTTP {status}")
    # 400/403/…: the same request will be refused again; Strava's 403 is a missing scope.
    code = "forbidden" if status == 403 else f"http_{status}"
    raise ProviderPermanentError(f"{what}: HTTP {status}", code=code)


def exchange_code(http: httpx.Client, *, token_url: str, client_id: str, client_secret: str,
                  code: str, grant_type: str = "authorization_code",
                  code_verifier: str | None = None) -> dict[str, Any]:
    """POST the OAuth token endpoint; returns Strava's JSON (tokens, expiry, athlete).

    Used for the code exchange (contract §9b) and, with ``grant_type`` =
    ``refresh_token`` and ``code`` = the refresh token, for refreshes.
    """
    for secret in (client_secret, code):
        register_secret(secret)
    form = {"client_id": client_id, "client_secret": client_secret, "grant_type": grant_type}
    form["refresh_token" if grant_type == "refresh_token" else "code"] = code
    if code_verifier:
        register_secret(code_verifier)
        form["code_verifier"] = code_verifier
    try:
        response = http.post(token_url, data=form, timeout=TOKEN_TIMEOUT_S,
                             headers={"Accept": "application/json"})
    except httpx.HTTPError as exc:
        raise ProviderTransientError(f"POST {TOKEN_PATH}: {type(exc).__name__}") from None
    status = response.status_code
    if status in (400, 401, 403):
        reason = "invalid_grant" if "invalid" in response.text else "exchange_rejected"
        raise ProviderAuthError(f"POST {TOKEN_PATH}: HTTP {status} ({reason})", code=reason)
    check_status(response, f"POST {TOKEN_PATH}")
    try:
        body = response.json()
    except ValueError:
        raise ProviderTransientError(f"POST {TOKEN_PATH}: undecodable JSON") from None
    if not isinstance(body, dict) or not body.get("access_token"):
        raise ProviderPermanentError(f"POST {TOKEN_PATH}: no access_token in reply", code="bad_reply")
    for key in ("access_token", "refresh_token"):
        register_secret(body.get(key))
    return body


def token_expiry(body: dict[str, Any], now: datetime | None = None) -> datetime:
    """``expires_at`` (unix) else ``expires_in`` else six hours, as Strava tokens live."""
    now = now or datetime.now(UTC)
    if isinstance(body.get("expires_at"), (int, float)) and body["expires_at"] > 0:
        return datetime.fromtimestamp(body["expires_at"], UTC)
    if isinstance(body.get("expires_in"), (int, float)) and body["expires_in"] > 0:
        return datetime.fromtimestamp(now.timestamp() + body["expires_in"], UTC)
    return datetime.fromtimestamp(now.timestamp() + 6 * 3600, UTC)


def _safe_id(value: str) -> str:
    """Provider ids are decimal (activities) or short alnum (gear): refuse path tricks."""
    value = str(value).strip()
    if not value or not value.isalnum():
        raise ProviderPermanentError("invalid provider id", code="bad_ext_id")
    return value


def _path_only(path: str) -> str:
    return path.split("?", 1)[0]
