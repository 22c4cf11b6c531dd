"""The fake Strava's API endpoints and the plumbing every one of them goes through."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import Response

from devstack.fakes.strava.data import FakeAthlete, gear_summary, start_ts
from devstack.fakes.strava.limits import RateBudget
from devstack.fakes.strava.oauth import OAuthState, Token

DEFAULT_PER_PAGE = 30  # Strava's page size when ``per_page`` is absent
MAX_PER_PAGE = 200  # Strava caps ``per_page`` here


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


class Endpoints:
    """``/api/v3`` and ``/oauth/token`` for ``FakeStrava``, which owns the state named here."""

    clock: Callable[[], float]
    _lock: Any
    _athletes: dict[int, FakeAthlete]
    _budget: RateBudget
    _oauth: OAuthState
    _faults: dict[str, list[int]]
    _log: list[RequestRecord]

    # ---- HTTP plumbing ---------------------------------------------------------------------
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

    def _record(self, request: Request, endpoint: str, status: int, token: Token | None) -> None:
        self._log.append(RequestRecord(request.method, request.url.path, endpoint, dict(request.query_params),
                                       status, token.athlete_id if token else None,
                                       token.client_id if token else None, self.clock()))

    def _api(self, request: Request, endpoint: str,
             handler: Callable[[FakeAthlete], tuple[int, Any]]) -> Response:
        """Auth → forced 429 → budget → usage → injected fault → handler, as Strava orders them.

        An injected fault comes after the request is counted, as a real 5xx would be.
        """
        with self._lock:
            token = self._oauth.authenticate(request.headers.get("authorization", ""), self._athletes)
            if token is None:
                self._record(request, endpoint, 401, None)
                return self._json(self._error_body(401, "Athlete", "access_token"), 401)
            verdict = self._budget.admit(token.client_id, is_read=request.method == "GET")
            if not verdict.allowed:
                self._record(request, endpoint, 429, token)
                return self._json(self._error_body(429, "Application", "rate limit"), 429, verdict.headers)
            faults = self._faults.get(endpoint)
            status = faults.pop(0) if faults else 0  # 0: a call ``fail(..., after=n)`` lets through
            if status:
                self._record(request, endpoint, status, token)
                headers = verdict.headers  # a 429 reports its window spent, as Strava's does
                if status == 429:
                    headers = self._budget.headers(self._budget.current(token.client_id), "short")
                return self._json(self._error_body(status), status, headers)
            status, body = handler(self._athletes[token.athlete_id])
            self._record(request, endpoint, status, token)
            return self._json(body, status, verdict.headers)

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
                ts = start_ts(act)  # an unusable start_date lists as the oldest activity
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
            grant = self._oauth.exchange(form, self._athletes)
            self._record(request, "token", grant.status, grant.token)
            return self._json(grant.render(), grant.status)
