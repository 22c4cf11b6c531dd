"""The fake Garmin's Connect API (``connectapi.<domain>``): the four calls the pool makes.

Bearer auth with the OAuth2 token the exchange issued (401 otherwise, as
Connect answers an expired or revoked token):

* ``GET /activitylist-service/activities/search/activities?start=&limit=&startDate=``
  — the account's activities newest first; ``startDate`` filters on the local date;
* ``GET /activity-service/activity/<id>`` — Connect's activity summary, 404 for
  an id the account does not have;
* ``GET /gear-service/gear/filterGear?activityId=<id>`` — the activity's gear;
* ``GET /download-service/files/activity/<id>`` — the original upload, a zip
  (``application/x-zip-compressed``, ``attachment; filename="<id>.zip"``).

Every endpoint can be made to fail (``FakeGarmin.fail``): 429 with or without
``Retry-After``, 5xx, anything.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from devstack.fakes.garmin.data import FakeAccount, FakeActivity
from devstack.fakes.garmin.sso import GarminState

DEFAULT_LIMIT = 20
MAX_LIMIT = 1000


class ConnectRoutes:
    def __init__(self, state: GarminState) -> None:
        self.state = state

    def _account(self, request: Request) -> FakeAccount | None:
        header = request.headers.get("authorization", "")
        token = header[len("Bearer "):] if header.lower().startswith("bearer ") else ""
        with self.state.lock:
            email = self.state.bearers.get(token)
            return self.state.accounts.get(email) if email else None

    def _begin(self, endpoint: str, request: Request) -> tuple[FakeAccount | None, Response | None]:
        if (fault := self.state.fault(endpoint, request)) is not None:
            return None, fault
        account = self._account(request)
        if account is None:
            self.state.record(endpoint, request, 401)
            return None, JSONResponse({"message": "Unauthorized"}, 401)
        return account, None

    def _activity(self, endpoint: str, request: Request, account: FakeAccount) -> FakeActivity | None:
        try:
            activity = account.activities.get(int(request.path_params.get("activity_id")
                                                  or request.query_params.get("activityId") or 0))
        except ValueError:
            activity = None
        self.state.record(endpoint, request, 200 if activity else 404, account.email)
        return activity

    async def list_activities(self, request: Request) -> Response:
        account, refused = self._begin("list", request)
        if account is None:
            return refused  # type: ignore[return-value]
        start = max(0, int(request.query_params.get("start", 0)))
        limit = min(MAX_LIMIT, max(1, int(request.query_params.get("limit", DEFAULT_LIMIT))))
        since = request.query_params.get("startDate", "")
        rows = [a.list_row() for a in account.newest_first()]
        if since:
            rows = [r for r in rows if r["startTimeLocal"][:10] >= since]
        self.state.record("list", request, 200, account.email)
        return JSONResponse(rows[start:start + limit])

    async def activity(self, request: Request) -> Response:
        account, refused = self._begin("activity", request)
        if account is None:
            return refused  # type: ignore[return-value]
        activity = self._activity("activity", request, account)
        if activity is None:
            return JSONResponse({"message": "Activity not found"}, 404)
        return JSONResponse(activity.summary())

    async def gear(self, request: Request) -> Response:
        account, refused = self._begin("gear", request)
        if account is None:
            return refused  # type: ignore[return-value]
        activity = self._activity("gear", request, account)
        return JSONResponse(account.gear_for(activity) if activity else [])

    async def download(self, request: Request) -> Response:
        account, refused = self._begin("download", request)
        if account is None:
            return refused  # type: ignore[return-value]
        activity = self._activity("download", request, account)
        if activity is None:
            return JSONResponse({"message": "Activity not found"}, 404)
        return Response(activity.original_zip(), media_type="application/x-zip-compressed",
                        headers={"Content-Disposition": f'attachment; filename="{activity.activity_id}.zip"'})
