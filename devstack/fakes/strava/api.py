"""Fake Strava API v3 for tests, the demo and the benchmark.

It behaves like the parts of www.strava.com the provider pool uses (reference
``cairn.md`` §4): Bearer auth, the activity list / detail / streams / photos,
segments, gear and athlete endpoints, the OAuth token endpoint, per-app usage
headers on a 15-minute window aligned to :00/:15/:30/:45 and a daily window
reset at 00:00 UTC (overall and read budgets), 429 when over budget, and
injectable faults. This module is the ``FakeStrava`` facade tests drive and
its routes; the rest lives next door, one concept each: ``endpoints`` (the
handlers and the auth, budget and fault plumbing they share), ``data``
(the athletes' data, deterministic from the athlete id),
``limits`` (usage windows, usage headers, the 429 decision) and
``oauth`` (apps, codes, token exchange and refresh). Responses are
computed in memory (no artificial latency: the benchmark needs it fast). Runs on
uvicorn in a background thread on 127.0.0.1, free port.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Route

from devstack.fakes.http_server import BackgroundServer
from devstack.fakes.strava.data import (
    ACTIVITY_SPACING_S,
    FakeAthlete,
    generate_activity,
    generate_gear,
)
from devstack.fakes.strava.endpoints import DEFAULT_PER_PAGE, MAX_PER_PAGE, RequestRecord

# Re-exported: tests and the bench import the window lengths, budgets and OAuth defaults from here.
from devstack.fakes.strava.limits import DAY_S, DEFAULT_LIMITS, DEFAULT_READ_LIMITS, SHORT_WINDOW_S, RateBudget
from devstack.fakes.strava.media import CDN_PREFIX, MediaMixin
from devstack.fakes.strava.oauth import (
    ACCESS_TOKEN_TTL_S,
    DEFAULT_CLIENT_ID,
    DEFAULT_SCOPE,
    REFRESH_REISSUE_WINDOW_S,
    TOKEN_BYTES,
    OAuthState,
)
from devstack.fakes.strava.push import StravaPush
from devstack.infra.services import listen_host

__all__ = ["ACCESS_TOKEN_TTL_S", "API_PREFIX", "DAY_S", "DEFAULT_CLIENT_ID", "DEFAULT_LIMITS", "DEFAULT_PER_PAGE",
           "DEFAULT_READ_LIMITS", "DEFAULT_SCOPE", "ENDPOINTS", "MAX_PER_PAGE", "REFRESH_REISSUE_WINDOW_S",
           "SHORT_WINDOW_S", "FakeAthlete", "FakeStrava", "RequestRecord"]

API_PREFIX = "/api/v3"
SERVER_START_TIMEOUT_S = 10.0
SERVER_STOP_TIMEOUT_S = 5.0
ENDPOINTS = ("list_activities", "activity", "streams", "photos", "segment", "gear", "athlete", "token")


class FakeStrava(MediaMixin):
    """In-memory Strava with the HTTP surface the provider pool talks to (photos, CDN: ``MediaMixin``)."""

    def __init__(self, *, limits: tuple[int, int] = DEFAULT_LIMITS,
                 read_limits: tuple[int, int] = DEFAULT_READ_LIMITS,
                 clock: Callable[[], float] = time.time,
                 client_id: str = DEFAULT_CLIENT_ID, client_secret: str | None = None,
                 rotate_refresh_tokens: bool = True) -> None:
        self.clock = clock
        self.client_id = client_id
        self.client_secret = client_secret or secrets.token_hex(TOKEN_BYTES)
        self._lock = threading.RLock()  # one lock for all state below: uvicorn's thread and the test's
        self._budget = RateBudget(limits, read_limits, self._now)
        self._oauth = OAuthState(self._now, rotate_refresh_tokens)
        self._oauth.add_app(client_id, self.client_secret)
        self._athletes: dict[int, FakeAthlete] = {}
        self._faults: dict[str, list[int]] = {}
        self._log: list[RequestRecord] = []
        self.http: BackgroundServer | None = None
        self.port = 0
        self.tls: tuple[Path, Path] | None = None  # (certificate, key): serve https (another host's pool)
        self.push = StravaPush(self._valid_app, self._now)  # webhooks: push.py
        self.app = Starlette(routes=[
            Route(API_PREFIX + "/push_subscriptions", self.push.collection, methods=["GET", "POST"]),
            Route(API_PREFIX + "/push_subscriptions/{id:int}", self.push.item, methods=["DELETE"]),
            Route(API_PREFIX + "/athlete/activities", self._list_activities),
            Route(API_PREFIX + "/athlete", self._athlete),
            Route(API_PREFIX + "/activities/{id:int}", self._activity),
            Route(API_PREFIX + "/activities/{id:int}/streams", self._streams),
            Route(API_PREFIX + "/activities/{id:int}/photos", self._photos),
            Route(API_PREFIX + "/segments/{id:int}", self._segment),
            Route(API_PREFIX + "/gear/{id}", self._gear),
            Route(CDN_PREFIX + "/{name}", self._cdn),
            Route("/oauth/token", self._oauth_token, methods=["POST"]),
        ])

    # ---- configuration ---------------------------------------------------------------------
    def _now(self) -> float:
        """The clock the state modules read: late-bound, so assigning ``self.clock`` still takes effect."""
        return self.clock()

    @property
    def limits(self) -> tuple[int, int]:
        """Overall budget per application (15-min, daily)."""
        return self._budget.limits

    @limits.setter
    def limits(self, value: tuple[int, int]) -> None:
        self._budget.limits = value

    @property
    def read_limits(self) -> tuple[int, int]:
        """Read (GET) budget per application (15-min, daily)."""
        return self._budget.read_limits

    @read_limits.setter
    def read_limits(self, value: tuple[int, int]) -> None:
        self._budget.read_limits = value

    @property
    def rotate_refresh_tokens(self) -> bool:
        """Whether a refresh that issues a new access token also replaces the refresh token."""
        return self._oauth.rotate_refresh_tokens

    @rotate_refresh_tokens.setter
    def rotate_refresh_tokens(self, value: bool) -> None:
        self._oauth.rotate_refresh_tokens = value

    def _valid_app(self, client_id: str, client_secret: str) -> bool:
        with self._lock:
            return self._oauth.valid_app(client_id, client_secret)

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{listen_host()}:{self.port}"

    @property
    def api_url(self) -> str:
        return self.base_url + API_PREFIX

    @property
    def token_url(self) -> str:
        return self.base_url + "/oauth/token"

    def start(self) -> FakeStrava:
        """Serve on a free loopback port (``http_server``: no Nagle delay on keep-alive replies)."""
        tls = {"ssl_certfile": str(self.tls[0]), "ssl_keyfile": str(self.tls[1])} if self.tls else None
        self.http = BackgroundServer(self.app, "fake-strava", start_timeout_s=SERVER_START_TIMEOUT_S,
                                     stop_timeout_s=SERVER_STOP_TIMEOUT_S, uvicorn_options=tls).start()
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
            self._oauth.add_app(client_id, client_secret)

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
            self._oauth.issue_tokens(ath)
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

    def patch_activity(self, athlete_id: int, activity_id: int, **fields: Any) -> dict[str, Any]:
        """Overwrite fields of an activity (``None`` deletes one), e.g. a broken manual entry
        without a usable ``start_date`` or with ``elapsed_time`` 0, which the pool must fail."""
        with self._lock:
            act = self._athletes[athlete_id].activities[activity_id]
            for key, value in fields.items():
                if value is None:
                    act.pop(key, None)
                else:
                    act[key] = value
            return dict(act)

    def delete_activity(self, athlete_id: int, activity_id: int) -> None:
        with self._lock:
            self._athletes[athlete_id].activities.pop(activity_id, None)

    # ---- webhooks: change data as the athlete would, and push the event (push.py) ----------
    def _app_of(self, athlete_id: int) -> str:
        with self._lock:
            return self._athletes[athlete_id].client_id

    def create_activity(self, athlete_id: int, start: float | None = None, *, photos: int = 0,
                        segments: int = 0) -> dict[str, Any]:
        """A new upload (``photos`` photos, efforts on ``segments`` new segments): the activity
        exists, then its ``create`` event is pushed."""
        act = self.add_activity(athlete_id, start)
        if segments:
            self.add_segment_efforts(athlete_id, act["id"], segments)
        for n in range(photos):
            self.add_photo(athlete_id, act["id"], caption=f"photo {n + 1}")
        act = self.athlete(athlete_id).activities[act["id"]]
        self.push.push(self._app_of(athlete_id), "activity", act["id"], "create", athlete_id)
        return act

    def update_activity(self, athlete_id: int, activity_id: int, *, event_time: int | None = None,
                        **fields: Any) -> dict[str, Any] | None:
        """Edit ``title``/``type``/``private`` (Strava's ``updates`` keys) and push ``update``."""
        renames = {"title": "name", "type": "sport_type", "private": "private"}
        self.patch_activity(athlete_id, activity_id, **{renames.get(k, k): v for k, v in fields.items()})
        return self.push.push(self._app_of(athlete_id), "activity", activity_id, "update", athlete_id,
                              updates=fields, event_time=event_time)

    def remove_activity(self, athlete_id: int, activity_id: int) -> dict[str, Any] | None:
        """The athlete deletes the activity: it is gone, then ``delete`` is pushed."""
        self.delete_activity(athlete_id, activity_id)
        return self.push.push(self._app_of(athlete_id), "activity", activity_id, "delete", athlete_id)

    def deauthorize(self, athlete_id: int) -> dict[str, Any] | None:
        """The athlete revokes the app: tokens die, then athlete ``update`` ``authorized=false`` is pushed."""
        self.revoke(athlete_id)
        return self.push.push(self._app_of(athlete_id), "athlete", athlete_id, "update", athlete_id,
                              updates={"authorized": "false"})

    def issue_code(self, athlete_id: int, client_id: str | None = None, scope: str = DEFAULT_SCOPE) -> str:
        """An authorization code as the authorize redirect would deliver it (one use)."""
        with self._lock:
            return self._oauth.issue_code(athlete_id, client_id or self.client_id, scope)

    def expire_token(self, athlete_id: int) -> None:
        """Make the athlete's current access token expired (forces the refresh path)."""
        with self._lock:
            self._oauth.expire(self._athletes[athlete_id])

    def revoke(self, athlete_id: int) -> None:
        """Deauthorize: every token of the athlete stops working (401 / invalid grant)."""
        with self._lock:
            self._oauth.revoke(athlete_id)

    def force_429(self, times: int = 1, window: str = "short", retry_after_s: float | None = None) -> None:
        """The next ``times`` API calls answer 429 as if ``window`` ("short"|"daily") were spent."""
        with self._lock:
            self._budget.force_429(times, window, retry_after_s)

    def fail(self, endpoint: str, status: int, times: int = 1, *, after: int = 0) -> None:
        """The next ``times`` calls to ``endpoint`` (one of ``ENDPOINTS``) answer ``status``,
        after ``after`` calls that are answered normally."""
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}, expected one of {ENDPOINTS}")
        with self._lock:
            self._faults.setdefault(endpoint, []).extend([0] * after + [status] * times)

    def set_usage(self, short: int, daily: int, *, read_short: int | None = None,
                  read_daily: int | None = None, client_id: str | None = None) -> None:
        """Preset the app's counters in the current windows (reads default to the overall counts)."""
        with self._lock:
            self._budget.set_usage(client_id or self.client_id, short, daily, read_short, read_daily)

    def usage(self, client_id: str | None = None) -> dict[str, int]:
        with self._lock:
            return self._budget.snapshot(client_id or self.client_id)

    def athlete(self, athlete_id: int) -> FakeAthlete:
        return self._athletes[athlete_id]

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._log)

    def clear_requests(self) -> None:
        with self._lock:
            self._log.clear()
