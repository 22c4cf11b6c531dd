"""The fake Strava API answers like Strava where the provider pool can tell."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise

import httpx
import pytest

from devstack.fakes.strava import SHORT_WINDOW_S, FakeStrava

ATHLETE = 7001
ANCHOR = 1_790_000_000.0  # fixed newest start time → fully deterministic data


class Clock:
    """A settable clock, so window rollovers need no waiting."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def strava() -> Iterator[FakeStrava]:
    with FakeStrava() as fake:
        fake.add_athlete(ATHLETE, n_activities=20, anchor=ANCHOR)
        yield fake


@pytest.fixture()
def api(strava: FakeStrava) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=strava.api_url, headers={
            "Authorization": f"Bearer {strava.athlete(ATHLETE).access_token}"}) as client:
        yield client


def test_pagination_order_and_filters(api: httpx.Client) -> None:
    pages = [api.get("/athlete/activities", params={"page": p, "per_page": 7}).json() for p in (1, 2, 3, 4)]
    assert [len(p) for p in pages] == [7, 7, 6, 0]
    starts = [a["start_date"] for page in pages for a in page]
    assert starts == sorted(starts, reverse=True) and len(set(starts)) == 20
    first = pages[0][0]
    assert first["resource_state"] == 2 and first["athlete"]["id"] == ATHLETE and "laps" not in first
    after = int(ANCHOR) - 3 * 86400
    newer = api.get("/athlete/activities", params={"after": after, "per_page": 200}).json()
    assert newer and [a["start_date"] for a in newer] == sorted(a["start_date"] for a in newer)  # ascending
    before = api.get("/athlete/activities", params={"before": after, "per_page": 200}).json()
    assert len(newer) + len(before) == 20
    assert api.get("/athlete/activities", params={"page": 0}).status_code == 400


def test_detail_streams_gear_and_athlete(api: httpx.Client, strava: FakeStrava) -> None:
    ride_id = ATHLETE * 100_000 + 1
    detail = api.get(f"/activities/{ride_id}", params={"include_all_efforts": "true"}).json()
    for key in ("id", "name", "sport_type", "start_date", "timezone", "elapsed_time", "moving_time", "distance",
                "average_heartrate", "has_heartrate", "average_watts", "gear_id", "laps", "segment_efforts"):
        assert key in detail, key
    assert detail["sport_type"] == "Ride" and detail["laps"] and detail["segment_efforts"]
    keys = "time,latlng,altitude,distance,velocity_smooth,heartrate,cadence,watts,temp,grade_smooth"
    streams = api.get(f"/activities/{ride_id}/streams", params={"keys": keys, "key_by_type": "true"}).json()
    assert set(streams) == set(keys.split(","))
    n = streams["time"]["original_size"]
    assert all(len(s["data"]) == n and s["resolution"] == "high" for s in streams.values())
    times = streams["time"]["data"]
    assert times[0] == 0 and all(b > a for a, b in pairwise(times))
    as_list = api.get(f"/activities/{ride_id}/streams", params={"keys": "time"}).json()
    assert {s["type"] for s in as_list} == {"time", "distance"}
    gear = api.get(f"/gear/{detail['gear_id']}").json()
    assert gear["id"] == detail["gear_id"] and gear["distance"] > 0 and "brand_name" in gear
    athlete = api.get("/athlete").json()
    assert athlete["id"] == ATHLETE and any(g["retired"] for g in athlete["bikes"] + athlete["shoes"])
    segment_id = detail["segment_efforts"][0]["segment"]["id"]
    assert api.get(f"/segments/{segment_id}").json()["map"]["polyline"]
    assert api.get(f"/activities/{ride_id}/photos").json() == []
    assert api.get("/activities/1").status_code == 404
    assert api.get("/gear/b1").json()["message"] == "Record Not Found"


def test_generation_is_deterministic() -> None:
    one, two = FakeStrava(), FakeStrava()
    a = one.add_athlete(ATHLETE, n_activities=5, anchor=ANCHOR)
    b = two.add_athlete(ATHLETE, n_activities=5, anchor=ANCHOR)
    assert a.activities == b.activities and a.streams == b.streams and a.gear == b.gear


def test_auth_and_oauth_grants(strava: FakeStrava) -> None:
    url = strava.api_url + "/athlete"
    assert httpx.get(url).status_code == 401
    bad = httpx.get(url, headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.json()["message"] == "Authorization Error"

    athlete = strava.add_athlete(7002, n_activities=1)
    code = strava.issue_code(7002)
    granted = httpx.post(strava.token_url, data={"client_id": strava.client_id, "client_secret": strava.client_secret,
                                                 "code": code, "grant_type": "authorization_code"}).json()
    assert granted["athlete"]["id"] == 7002 and granted["token_type"] == "Bearer"
    assert granted["expires_at"] > 0 and granted["access_token"] == athlete.access_token
    reused = httpx.post(strava.token_url, data={"client_id": strava.client_id, "client_secret": strava.client_secret,
                                                "code": code, "grant_type": "authorization_code"})
    assert reused.status_code == 400 and "invalid" in reused.text

    strava.expire_token(7002)
    assert httpx.get(url, headers={"Authorization": f"Bearer {granted['access_token']}"}).status_code == 401
    refreshed = httpx.post(strava.token_url, data={
        "client_id": strava.client_id, "client_secret": strava.client_secret,
        "grant_type": "refresh_token", "refresh_token": granted["refresh_token"]}).json()
    assert refreshed["access_token"] != granted["access_token"] and "athlete" not in refreshed
    assert httpx.get(url, headers={"Authorization": f"Bearer {refreshed['access_token']}"}).status_code == 200
    stale = httpx.post(strava.token_url, data={
        "client_id": strava.client_id, "client_secret": strava.client_secret,
        "grant_type": "refresh_token", "refresh_token": granted["refresh_token"]})
    assert stale.status_code == 400 and "invalid" in stale.text  # rotated away
    wrong_client = httpx.post(strava.token_url, data={"client_id": strava.client_id, "client_secret": "x",
                                                      "grant_type": "refresh_token",
                                                      "refresh_token": refreshed["refresh_token"]})
    assert wrong_client.status_code == 401
    log = " ".join(repr(r) for r in strava.requests)
    assert refreshed["access_token"] not in log and strava.client_secret not in log


def test_usage_headers_windows_and_429() -> None:
    clock = Clock(1_790_000_000.0 // SHORT_WINDOW_S * SHORT_WINDOW_S + 10)
    with FakeStrava(limits=(5, 12), read_limits=(3, 10), clock=clock) as strava:
        token = strava.add_athlete(1, n_activities=1).access_token
        with httpx.Client(base_url=strava.api_url, headers={"Authorization": f"Bearer {token}"}) as api:
            first = api.get("/athlete")
            assert first.headers["X-RateLimit-Limit"] == "5,12" and first.headers["X-RateLimit-Usage"] == "1,1"
            assert first.headers["X-ReadRateLimit-Limit"] == "3,10" and first.headers["X-ReadRateLimit-Usage"] == "1,1"
            api.get("/athlete")
            api.get("/athlete")
            over = api.get("/athlete")
            assert over.status_code == 429 and over.json()["message"] == "Rate Limit Exceeded"
            assert over.headers["X-ReadRateLimit-Usage"] == "3,3"
            clock.now += SHORT_WINDOW_S  # next quarter hour: the 15-minute window resets, the day does not
            again = api.get("/athlete")
            assert again.status_code == 200 and again.headers["X-ReadRateLimit-Usage"] == "1,4"

            strava.force_429(times=2, window="daily", retry_after_s=30)
            forced = [api.get("/athlete") for _ in range(3)]
            assert [r.status_code for r in forced] == [429, 429, 200]
            assert forced[0].headers["Retry-After"] == "30"
            assert forced[0].headers["X-ReadRateLimit-Usage"].split(",")[1] == "10"

            clock.now += SHORT_WINDOW_S
            strava.fail("athlete", 503, times=1)
            failed = api.get("/athlete")
            assert failed.status_code == 503 and "X-RateLimit-Usage" in failed.headers
            assert api.get("/athlete").status_code == 200
            statuses = [(r.endpoint, r.status) for r in strava.requests]
            assert statuses.count(("athlete", 429)) == 3 and ("athlete", 503) in statuses
            with pytest.raises(ValueError):
                strava.fail("nope", 500)
