"""Fake Strava API v3 for tests, the demo and the benchmark.

It behaves like the parts of www.strava.com the provider pool uses (reference
``cairn.md`` §4): Bearer auth, the activity list / detail / streams / photos,
segments, gear and athlete endpoints, the OAuth token endpoint, per-app usage
headers on a 15-minute window aligned to :00/:15/:30/:45 and a daily window
reset at 00:00 UTC (overall and read budgets), 429 when over budget, and
injectable faults. The data comes from ``strava_data`` (deterministic from the
athlete id); responses are computed in memory (no artificial latency: the
benchmark needs it fast). Runs on uvicorn in a background thread on 127.0.0.1,
free port.
"""

from __future__ import annotations

import json
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deploy.devstack.http_server import BackgroundServer
from deploy.devstack.strava_data import (ACTIVITY_SPACING_S, FakeAthlete, gear_summary, generate_activity,
                                         generate_gear)

API_PREFIX = "/api/v3"
ACCESS_TOKEN_TTL_S = 6 * 3600  # Strava access tokens live six hours
REFRESH_REISSUE_WINDOW_S = 3600  # a refresh returns the current token while it has more than 1 h left
SHORT_WINDOW_S = 15 * 60
DAY_S = 24 * 3600
DEFAULT_LIMITS = (200, 2000)  # overall (15-min, daily) per application
DEFAULT_READ_LIMITS = (100, 1000)  # read (GET) budget (15-min, daily)
DEFAULT_PER_PAGE = 30
MAX_PER_PAGE = 200
DEFAULT_CLIENT_ID = "12345"
DEFAULT_SCOPE = "read,activity:read_all"
SERVER_START_TIMEOUT_S = 10.0
SERVER_STOP_TIMEOUT_S = 5.0
ENDPOINTS = ("list_activities", "activity", "streams", "photos", "segment", "gear", "athlete", "token")


@dataclass(frozen=True)
class RequestRecord:
    """What the fake saw (never the Authorization header or form secrets)."""

    method: str
    path: str
    endpoint: str
    query: dict[str, str]
    status: int
    athlete_id: int | None
    client_id: str | None
    at: float


@dataclass
class _Usage:
    short_window: int = -1
    day: int = -1
    short: int = 0
    daily: int = 0
    read_short: int = 0
    read_daily: int = 0


@dataclass
class _Token:
    athlete_id: int
    client_id: str
    expires_at: int


class FakeStrava:
    """In-memory Strava with the HTTP surface the provider pool talks to."""

    def __init__(self, *, limits: tuple[int, int] = DEFAULT_LIMITS,
                 read_limits: tuple[int, int] = DEFAULT_READ_LIMITS,
                 clock: Callable[[], float] = time.time,
                 client_id: str = DEFAULT_CLIENT_ID, client_secret: str | None = None,
                 rotate_refresh_tokens: bool = True) -> None:
        self.limits, self.read_limits, self.clock = limits, read_limits, clock
        self.rotate_refresh_tokens = rotate_refresh_tokens
        self.client_id = client_id
        self.client_secret = client_secret or secrets.token_hex(20)
        self._lock = threading.RLock()
        self._apps: dict[str, str] = {client_id: self.client_secret}
        self._athletes: dict[int, FakeAthlete] = {}
        self._tokens: dict[str, _Token] = {}
        self._refresh: dict[str, _Token] = {}
        self._codes: dict[str, tuple[int, str, str]] = {}
        self._usage: dict[str, _Usage] = {}
        self._forced_429: list[tuple[str, float | None]] = []
        self._faults: dict[str, list[int]] = {}
        self._log: list[RequestRecord] = []
        self.http: BackgroundServer | None = None
        self.port = 0
        self.app = Starlette(routes=[
            Route(API_PREFIX + "/athlete/activities", self._list_activities),
            Route(API_PREFIX + "/athlete", self._athlete),
            Route(API_PREFIX + "/activities/{id:int}", self._activity),
            Route(API_PREFIX + "/activities/{id:int}/streams", self._streams),
            Route(API_PREFIX + "/activities/{id:int}/photos", self._photos),
            Route(API_PREFIX + "/segments/{id:int}", self._segment),
            Route(API_PREFIX + "/gear/{id}", self._gear),
            Route("/oauth/token", self._oauth_token, methods=["POST"]),
        ])

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return self.base_url + API_PREFIX

    @property
    def token_url(self) -> str:
        return self.base_url + "/oauth/token"

    def start(self) -> FakeStrava:
        """Serve on a free loopback port (``http_server``: no Nagle delay on keep-alive replies)."""
        self.http = BackgroundServer(self.app, "fake-strava", start_timeout_s=SERVER_START_TIMEOUT_S,
                                     stop_timeout_s=SERVER_STOP_TIMEOUT_S).start()
        self.port = self.http.port
        return self

    def stop(self) -> None:
        if self.http is not None:
            self.http.stop()
            self.http = None

    def __enter__(self) -> FakeStrava:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- test control ----------------------------------------------------------------------
    def add_app(self, client_id: str, client_secret: str) -> None:
        with self._lock:
            self._apps[client_id] = client_secret

    def add_athlete(self, athlete_id: int, n_activities: int = 20, with_gear: bool = True, *,
                    client_id: str | None = None, anchor: float | None = None) -> FakeAthlete:
        """Create an athlete with a token pair and ``n_activities`` deterministic activities.

        ``anchor`` (unix s, default: now floored to the hour) is the newest start time;
        the others follow ``ACTIVITY_SPACING_S`` apart, so the default 20 fit the 30-day
        reconcile window.
        """
        client_id = client_id or self.client_id
        with self._lock:
            ath = FakeAthlete(athlete_id, client_id, "", "", 0)
            self._athletes[athlete_id] = ath
            self._issue_tokens(ath)
            if with_gear:
                ath.gear = generate_gear(athlete_id)
            anchor = anchor if anchor is not None else float(int(self.clock()) // 3600 * 3600)
            for i in range(n_activities):
                generate_activity(ath, i, anchor - i * ACTIVITY_SPACING_S)
            return ath

    def add_activity(self, athlete_id: int, start: float | None = None) -> dict[str, Any]:
        """Append one more activity (newest by default), e.g. to test reconcile."""
        with self._lock:
            ath = self._athletes[athlete_id]
            return generate_activity(ath, len(ath.activities), start or self.clock() - 3600)

    def delete_activity(self, athlete_id: int, activity_id: int) -> None:
        with self._lock:
            self._athletes[athlete_id].activities.pop(activity_id, None)

    def issue_code(self, athlete_id: int, client_id: str | None = None, scope: str = DEFAULT_SCOPE) -> str:
        """An authorization code as the authorize redirect would deliver it (one use)."""
        code = secrets.token_hex(20)
        with self._lock:
            self._codes[code] = (athlete_id, client_id or self.client_id, scope)
        return code

    def expire_token(self, athlete_id: int) -> None:
        """Make the athlete's current access token expired (forces the refresh path)."""
        with self._lock:
            ath = self._athletes[athlete_id]
            ath.expires_at = int(self.clock()) - 1
            self._tokens[ath.access_token].expires_at = ath.expires_at

    def revoke(self, athlete_id: int) -> None:
        """Deauthorize: every token of the athlete stops working (401 / invalid grant)."""
        with self._lock:
            for table in (self._tokens, self._refresh):
                for tok in [k for k, v in table.items() if v.athlete_id == athlete_id]:
                    del table[tok]

    def force_429(self, times: int = 1, window: str = "short", retry_after_s: float | None = None) -> None:
        """The next ``times`` API calls answer 429 as if ``window`` ("short"|"daily") were spent."""
        if window not in ("short", "daily"):
            raise ValueError("window must be 'short' or 'daily'")
        with self._lock:
            self._forced_429.extend([(window, retry_after_s)] * times)

    def fail(self, endpoint: str, status: int, times: int = 1) -> None:
        """The next ``times`` calls to ``endpoint`` (one of ``ENDPOINTS``) answer ``status``."""
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}, expected one of {ENDPOINTS}")
        with self._lock:
            self._faults.setdefault(endpoint, []).extend([status] * times)

    def set_usage(self, short: int, daily: int, *, read_short: int | None = None,
                  read_daily: int | None = None, client_id: str | None = None) -> None:
        with self._lock:
            usage = self._current_usage(client_id or self.client_id)
            usage.short, usage.daily = short, daily
            usage.read_short = short if read_short is None else read_short
            usage.read_daily = daily if read_daily is None else read_daily

    def usage(self, client_id: str | None = None) -> dict[str, int]:
        with self._lock:
            u = self._current_usage(client_id or self.client_id)
            return {"short": u.short, "daily": u.daily, "read_short": u.read_short, "read_daily": u.read_daily}

    def athlete(self, athlete_id: int) -> FakeAthlete:
        return self._athletes[athlete_id]

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._log)

    def clear_requests(self) -> None:
        with self._lock:
            self._log.clear()

    # ---- tokens ----------------------------------------------------------------------------
    def _issue_tokens(self, ath: FakeAthlete) -> None:
        ath.access_token, ath.refresh_token = secrets.token_hex(20), secrets.token_hex(20)
        ath.expires_at = int(self.clock()) + ACCESS_TOKEN_TTL_S
        self._tokens[ath.access_token] = _Token(ath.athlete_id, ath.client_id, ath.expires_at)
        self._refresh[ath.refresh_token] = _Token(ath.athlete_id, ath.client_id, ath.expires_at)

    # ---- HTTP plumbing ---------------------------------------------------------------------
    def _current_usage(self, client_id: str) -> _Usage:
        now = self.clock()
        usage = self._usage.setdefault(client_id, _Usage())
        if usage.short_window != int(now // SHORT_WINDOW_S):
            usage.short_window, usage.short, usage.read_short = int(now // SHORT_WINDOW_S), 0, 0
        if usage.day != int(now // DAY_S):
            usage.day, usage.daily, usage.read_daily = int(now // DAY_S), 0, 0
        return usage

    def _rate_headers(self, usage: _Usage, forced: str | None = None) -> dict[str, str]:
        short, daily, rshort, rdaily = usage.short, usage.daily, usage.read_short, usage.read_daily
        if forced == "short":
            short, rshort = max(short, self.limits[0]), max(rshort, self.read_limits[0])
        elif forced == "daily":
            daily, rdaily = max(daily, self.limits[1]), max(rdaily, self.read_limits[1])
        return {"X-RateLimit-Limit": f"{self.limits[0]},{self.limits[1]}",
                "X-RateLimit-Usage": f"{short},{daily}",
                "X-ReadRateLimit-Limit": f"{self.read_limits[0]},{self.read_limits[1]}",
                "X-ReadRateLimit-Usage": f"{rshort},{rdaily}"}

    @staticmethod
    def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
        return Response(json.dumps(body, separators=(",", ":")), status, headers=headers,
                        media_type="application/json; charset=utf-8")

    @staticmethod
    def _error_body(status: int, resource: str = "Application", fld: str = "") -> dict[str, Any]:
        message = {400: "Bad Request", 401: "Authorization Error", 403: "Forbidden",
                   404: "Record Not Found", 429: "Rate Limit Exceeded"}.get(status, "Internal Server Error")
        code = {404: "not found", 429: "exceeded"}.get(status, "invalid")
        return {"message": message, "errors": [{"resource": resource, "field": fld, "code": code}]}

    def _record(self, request: Request, endpoint: str, status: int, token: _Token | None) -> None:
        self._log.append(RequestRecord(request.method, request.url.path, endpoint, dict(request.query_params),
                                       status, token.athlete_id if token else None,
                                       token.client_id if token else None, self.clock()))

    def _api(self, request: Request, endpoint: str,
             handler: Callable[[FakeAthlete], tuple[int, Any]]) -> Response:
        """Auth → forced 429 → budget → usage → injected fault → handler, as Strava orders them."""
        with self._lock:
            auth = request.headers.get("authorization", "")
            token = self._tokens.get(auth[7:]) if auth[:7].lower() == "bearer " else None
            if token is None or token.expires_at <= self.clock() or token.athlete_id not in self._athletes:
                self._record(request, endpoint, 401, None)
                return self._json(self._error_body(401, "Athlete", "access_token"), 401)
            usage = self._current_usage(token.client_id)
            if self._forced_429:
                window, retry_after = self._forced_429.pop(0)
                headers = self._rate_headers(usage, window)
                if retry_after is not None:
                    headers["Retry-After"] = str(int(math.ceil(retry_after)))
                self._record(request, endpoint, 429, token)
                return self._json(self._error_body(429, "Application", "rate limit"), 429, headers)
            is_read = request.method == "GET"
            over = (usage.short >= self.limits[0] or usage.daily >= self.limits[1]
                    or (is_read and (usage.read_short >= self.read_limits[0]
                                     or usage.read_daily >= self.read_limits[1])))
            if over:
                self._record(request, endpoint, 429, token)
                return self._json(self._error_body(429, "Application", "rate limit"), 429,
                                  self._rate_headers(usage))
            usage.short, usage.daily = usage.short + 1, usage.daily + 1
            if is_read:
                usage.read_short, usage.read_daily = usage.read_short + 1, usage.read_daily + 1
            headers = self._rate_headers(usage)
            faults = self._faults.get(endpoint)
            if faults:
                status = faults.pop(0)
                self._record(request, endpoint, status, token)
                return self._json(self._error_body(status), status, headers)
            status, body = handler(self._athletes[token.athlete_id])
            self._record(request, endpoint, status, token)
            return self._json(body, status, headers)

    # ---- endpoints -------------------------------------------------------------------------
    async def _list_activities(self, request: Request) -> Response:
        def handle(ath: FakeAthlete) -> tuple[int, Any]:
            q = request.query_params
            try:
                after = int(q["after"]) if q.get("after") else None
                before = int(q["before"]) if q.get("before") else None
                page = int(q.get("page") or 1)
                per_page = min(int(q.get("per_page") or DEFAULT_PER_PAGE), MAX_PER_PAGE)
            except ValueError:
                return 400, self._error_body(400, "Application", "page")
            if page < 1 or per_page < 1:
                return 400, self._error_body(400, "Application", "page")
            rows = []
            for act in ath.activities.values():
                ts = datetime.strptime(act["start_date"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
                if (after is None or ts > after) and (before is None or ts < before):
                    rows.append((ts, act))
            # Strava lists newest first, but oldest first when only ``after`` is given.
            rows.sort(key=lambda r: r[0], reverse=not (after is not None and before is None))
            chunk = rows[(page - 1) * per_page: page * per_page]
            return 200, [self._summary(act) for _, act in chunk]

        return self._api(request, "list_activities", handle)

    @staticmethod
    def _summary(act: dict[str, Any]) -> dict[str, Any]:
        drop = ("description", "calories", "segment_efforts", "laps", "gear", "photos", "device_name",
                "embed_token", "available_zones")
        out = {k: v for k, v in act.items() if k not in drop}
        out["resource_state"] = 2
        out["map"] = {"id": act["map"]["id"], "summary_polyline": act["map"]["summary_polyline"],
                      "resource_state": 2}
        return out

    async def _activity(self, request: Request) -> Response:
        aid = request.path_params["id"]
        return self._api(request, "activity", lambda ath: (200, ath.activities[aid]) if aid in ath.activities
                         else (404, self._error_body(404, "Activity", "id")))

    async def _streams(self, request: Request) -> Response:
        aid = request.path_params["id"]

        def handle(ath: FakeAthlete) -> tuple[int, Any]:
            if aid not in ath.activities:
                return 404, self._error_body(404, "Activity", "id")
            have = ath.streams.get(aid, {})
            keys = [k for k in (request.query_params.get("keys") or "").split(",") if k]
            wanted = [k for k in dict.fromkeys(keys + ["distance"]) if k in have] if keys else ["distance"]
            wanted = [k for k in wanted if k in have]
            if request.query_params.get("key_by_type", "").lower() == "true":
                return 200, {k: have[k] for k in wanted}
            return 200, [{"type": k} | have[k] for k in wanted]

        return self._api(request, "streams", handle)

    async def _photos(self, request: Request) -> Response:
        aid = request.path_params["id"]
        return self._api(request, "photos", lambda ath: (200, []) if aid in ath.activities
                         else (404, self._error_body(404, "Activity", "id")))

    async def _segment(self, request: Request) -> Response:
        sid = request.path_params["id"]
        return self._api(request, "segment", lambda ath: (200, ath.segments[sid]) if sid in ath.segments
                         else (404, self._error_body(404, "Segment", "id")))

    async def _gear(self, request: Request) -> Response:
        gid = request.path_params["id"]
        return self._api(request, "gear", lambda ath: (200, ath.gear[gid]) if gid in ath.gear
                         else (404, self._error_body(404, "Gear", "id")))

    async def _athlete(self, request: Request) -> Response:
        def handle(ath: FakeAthlete) -> tuple[int, Any]:
            summary = [gear_summary(g) for g in ath.gear.values()]
            return 200, {"id": ath.athlete_id, "username": f"athlete{ath.athlete_id}", "resource_state": 3,
                         "firstname": "Test", "lastname": f"Athlete {ath.athlete_id}", "city": "Zurich",
                         "country": "Switzerland", "sex": "F", "premium": False, "summit": False,
                         "created_at": "2020-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
                         "measurement_preference": "meters", "weight": 62.0, "ftp": None,
                         "bikes": [g for g in summary if g["id"].startswith("b")],
                         "shoes": [g for g in summary if g["id"].startswith("g")], "clubs": []}

        return self._api(request, "athlete", handle)

    async def _oauth_token(self, request: Request) -> Response:
        form = {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}
        form.update({k: v for k, v in request.query_params.items() if k not in form})
        with self._lock:
            faults = self._faults.get("token")
            if faults:
                status = faults.pop(0)
                self._record(request, "token", status, None)
                return self._json(self._error_body(status), status)
            client_id = form.get("client_id", "")
            if self._apps.get(client_id) is None or self._apps[client_id] != form.get("client_secret"):
                self._record(request, "token", 401, None)
                return self._json({"message": "Bad Request", "errors": [
                    {"resource": "Application", "field": "client_id", "code": "invalid"}]}, 401)
            grant = form.get("grant_type")
            if grant == "authorization_code":
                entry = self._codes.pop(form.get("code", ""), None)
                if entry is None or entry[1] != client_id or entry[0] not in self._athletes:
                    self._record(request, "token", 400, None)
                    return self._json({"message": "Bad Request", "errors": [
                        {"resource": "AuthorizationCode", "field": "code", "code": "invalid"}]}, 400)
                ath = self._athletes[entry[0]]
                ath.client_id = client_id
                self._issue_tokens(ath)
                body = self._token_body(ath) | {"athlete": {
                    "id": ath.athlete_id, "username": f"athlete{ath.athlete_id}", "resource_state": 2,
                    "firstname": "Test", "lastname": f"Athlete {ath.athlete_id}"}}
                self._record(request, "token", 200, self._tokens[ath.access_token])
                return self._json(body)
            if grant == "refresh_token":
                old = self._refresh.get(form.get("refresh_token", ""))
                if old is None or old.client_id != client_id or old.athlete_id not in self._athletes:
                    self._record(request, "token", 400, None)
                    return self._json({"message": "Bad Request", "errors": [
                        {"resource": "RefreshToken", "field": "refresh_token", "code": "invalid"}]}, 400)
                ath = self._athletes[old.athlete_id]
                if ath.expires_at - self.clock() <= REFRESH_REISSUE_WINDOW_S:
                    previous_refresh = ath.refresh_token
                    self._issue_tokens(ath)
                    if not self.rotate_refresh_tokens:
                        del self._refresh[ath.refresh_token]
                        ath.refresh_token = previous_refresh
                    elif previous_refresh != ath.refresh_token:
                        self._refresh.pop(previous_refresh, None)
                self._record(request, "token", 200, self._tokens[ath.access_token])
                return self._json(self._token_body(ath))
            self._record(request, "token", 400, None)
            return self._json({"message": "Bad Request", "errors": [
                {"resource": "Application", "field": "grant_type", "code": "invalid"}]}, 400)

    def _token_body(self, ath: FakeAthlete) -> dict[str, Any]:
        return {"token_type": "Bearer", "access_token": ath.access_token, "expires_at": ath.expires_at,
                "expires_in": max(int(ath.expires_at - self.clock()), 0), "refresh_token": ath.refresh_token}


def main() -> None:  # pragma: no cover - manual use
    """Run standalone: prints the base URL and one athlete's token."""
    strava = FakeStrava().start()
    ath = strava.add_athlete(1001)
    print(f"fake Strava on {strava.base_url}; athlete 1001 access token {ath.access_token}", flush=True)
    try:
        threading.Event().wait()
    finally:
        strava.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
