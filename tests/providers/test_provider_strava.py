"""The Strava provider against the fake Strava API (devstack/fakes/strava/) on loopback.

Nothing of ours is mocked: the provider, its httpx client, usage parsing,
mapping and archive run for real; only Strava is a fake (it speaks the real
API's shapes, usage headers, 429s and OAuth token endpoint).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from devstack.fakes.strava import FakeStrava
from devstack.fakes.strava.data import blank_samples
from tests.kit.cairn_ctx import RecordingHook
from workers.errors import ConfigError, PermanentJobError, RetryableJobError
from workers.providers.context import ProviderContext
from workers.providers.errors import (
    ProviderAuthError,
    ProviderNotFound,
    ProviderPermanentError,
    ProviderRateLimited,
    UnsupportedDataset,
)
from workers.providers.models import DiscoverRequest, PoolIdentity
from workers.providers.registry import get_provider
from workers.providers.strava.dataset import UnmappableActivity, build_archive, parse_archive
from workers.providers.strava.mapping import classify_sport, ingest_problems, map_activity, map_streams
from workers.providers.strava.models import StravaActivity
from workers.providers.strava.provider import StravaProvider
from workers.providers.strava.settings import StravaSettings
from workers.providers.strava.usage import (
    next_daily_reset,
    next_short_reset,
    parse_usage,
    rate_limited_from_429,
)

ATHLETE = 4242
USER_ID = "7d1d9a8e-7a57-4a53-9b1e-1f0c0d7a0001"
ACCOUNT_ID = "0b6c2f0e-3c1a-4f5e-8a55-2a3f7d9e0002"


@dataclass
class Job:
    user_id: str = USER_ID
    account_id: str = ACCOUNT_ID
    ext_id: str = ""
    fetch_streams: bool = True


@pytest.fixture(scope="module")
def strava() -> Iterator[FakeStrava]:
    with FakeStrava() as fake:
        fake.add_athlete(ATHLETE, n_activities=12)
        yield fake


@pytest.fixture()
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10.0) as client:
        yield client


@pytest.fixture()
def provider(strava: FakeStrava) -> StravaProvider:
    return StravaProvider(StravaSettings(base_url=strava.base_url),
                          pool=PoolIdentity("strava-test", "switchyard.test"))


def ctx_for(strava: FakeStrava, http: httpx.Client, hook: RecordingHook | None = None,
            athlete: int = ATHLETE) -> ProviderContext:
    return ProviderContext(access_token=strava.athlete(athlete).access_token, http=http,
                           rate_limit=hook or RecordingHook())


def activity_with_gear(strava: FakeStrava, athlete: int = ATHLETE) -> dict:
    return next(a for a in strava.athlete(athlete).activities.values() if a.get("gear_id"))


# ---------------------------------------------------------------- mapping (pure)

REALISTIC_ACTIVITY = {
    "id": 12345678987654321, "resource_state": 3, "name": "Morning Ride", "description": "Lake loop",
    "type": "Ride", "sport_type": "Ride", "workout_type": 11, "start_date": "2024-05-04T06:30:12Z",
    "start_date_local": "2024-05-04T08:30:12Z", "timezone": "(GMT+01:00) Europe/Zurich",
    "elapsed_time": 7322, "moving_time": 6900, "distance": 61234.5, "total_elevation_gain": 512.3,
    "average_speed": 8.874, "max_speed": 17.1, "has_heartrate": True, "average_heartrate": 141.9,
    "max_heartrate": 178.0, "average_watts": 201.7, "weighted_average_watts": 219, "max_watts": 688,
    "average_cadence": 86.6, "average_temp": 17, "calories": 1530.8, "kilojoules": 1391.9,
    "commute": False, "trainer": False, "gear_id": "b9876",
    "gear": {"id": "b9876", "name": "Canyon Ultimate", "primary": True, "distance": 1.2e6},
    "device_name": "Garmin Edge 840", "elev_high": None, "unknown_new_field": {"x": 1},
    "laps": [{"lap_index": 1, "name": "Lap 1", "start_date": "2024-05-04T06:30:12Z",
              "elapsed_time": 3600, "moving_time": 3500, "distance": 30000.0, "average_speed": 8.57,
              "average_heartrate": 139.5, "max_heartrate": 170.0, "average_watts": 198.4,
              "average_cadence": 85.5, "total_elevation_gain": 250.0},
             {"lap_index": 2, "name": "Lap 2", "start_date": "2024-05-04T07:30:12Z",
              "elapsed_time": 3722, "moving_time": 3400, "distance": 31234.5, "average_heartrate": None}],
}


def test_maps_a_realistic_activity() -> None:
    p = map_activity(StravaActivity.model_validate(REALISTIC_ACTIVITY))
    assert p["type"] == "ACTIVITY_TYPE_RIDE" and p["discipline"] == "DISCIPLINE_RIDE_ROAD"
    assert p["providerNativeType"] == "Ride" and "customSubtype" not in p
    assert p["isRace"] is True and "isCommute" not in p
    assert p["title"] == "Morning Ride" and p["description"] == "Lake loop"
    assert p["startTime"] == "2024-05-04T06:30:12Z" and p["endTime"] == "2024-05-04T08:32:14Z"
    assert p["elapsedDuration"] == "7322s" and p["movingDuration"] == "6900s"
    assert p["timezone"] == "Europe/Zurich"
    assert p["gearExternalId"] == "b9876" and p["gearName"] == "Canyon Ultimate"
    s = p["summary"]
    assert s == {"distanceM": 61234.5, "elevationGainM": 512.3, "avgSpeedMps": 8.874, "maxSpeedMps": 17.1,
                 "avgHeartRateBpm": 141, "maxHeartRateBpm": 178, "avgPowerW": 201, "maxPowerW": 688,
                 "normalizedPowerW": 219, "avgCadence": 86, "avgTemperatureC": 17.0,
                 "caloriesKcal": 1530}
    lap1, lap2 = p["laps"]
    assert lap1 == {"index": 1, "startTime": "2024-05-04T06:30:12Z", "elapsedDuration": "3600s",
                    "movingDuration": "3500s", "distanceM": 30000.0, "avgSpeedMps": 8.57,
                    "elevationGainM": 250.0, "avgHeartRateBpm": 140, "maxHeartRateBpm": 170,
                    "avgPowerW": 198, "avgCadence": 86, "label": "Lap 1"}
    assert "avgHeartRateBpm" not in lap2 and lap2["index"] == 2


def test_kilojoules_fallback_empty_summary_and_utc_default() -> None:
    p = map_activity(StravaActivity.model_validate(
        {"id": 1, "sport_type": "Run", "workout_type": 1, "start_date": "2024-01-01T00:00:00Z",
         "elapsed_time": 60, "kilojoules": 250.9, "has_heartrate": False, "average_heartrate": 150}))
    assert p["summary"] == {"caloriesKcal": 250} and p["timezone"] == "UTC" and p["isRace"] is True
    empty = map_activity(StravaActivity.model_validate({"id": 2, "type": "Ride", "elapsed_time": 5}))
    assert empty["summary"] == {} and "providerNativeType" not in empty  # legacy type only


@pytest.mark.parametrize(("sport", "expected"), [
    ("Ride", ("RIDE", "RIDE_ROAD", False, False)),
    ("GravelRide", ("RIDE", "RIDE_GRAVEL", False, False)),
    ("EMountainBikeRide", ("RIDE", "RIDE_MTB", True, False)),
    ("EBikeRide", ("RIDE", "RIDE_ROAD", True, False)),
    ("VirtualRide", ("RIDE", "RIDE_ROAD", False, True)),
    ("Velomobile", ("RIDE", "RIDE_TRACK", False, False)),
    ("TrailRun", ("RUN", "RUN_TRAIL", False, False)),
    ("VirtualRun", ("RUN", "RUN_ROAD", False, True)),
    ("RollerSki", ("SKI", "SKI_NORDIC", False, False)),
    ("BackcountrySki", ("SKI", "SKI_BACKCOUNTRY", False, False)),
    ("Canoeing", ("KAYAK", "", False, False)),
    ("Kitesurf", ("SURF", "", False, False)),
    ("Pickleball", ("TENNIS", "", False, False)),
    ("Handcycle", ("WHEELCHAIR", "", False, False)),
    ("Skateboard", ("SKATE", "", False, False)),
    ("WeightTraining", ("WORKOUT", "", False, False)),
])
def test_sport_table(sport: str, expected: tuple[str, str, bool, bool]) -> None:
    assert classify_sport(sport) == expected


def test_unknown_sport_is_workout_with_subtype() -> None:
    p = map_activity(StravaActivity.model_validate({"id": 3, "sport_type": "Crossfit", "elapsed_time": 9}))
    assert p["type"] == "ACTIVITY_TYPE_WORKOUT" and p["customSubtype"] == "Crossfit"
    assert "discipline" not in p


def test_streams_map_columns_gaps_and_clean_timestamps() -> None:
    streams = {
        "time": {"data": [0, 1, 2, 2, 1, 4]},  # duplicate 2 (last wins), 1 goes backwards (dropped)
        "latlng": {"data": [[47.0, 8.0], [47.1, 8.1], [47.2, 8.2], [47.25, 8.25], [9, 9], None]},
        "heartrate": {"data": [100.9, None, 120, 121, 0]},  # short: padded with 0 (int dense)
        "altitude": {"data": [400.0, 401.0, None, 403.0, 0, 405.5]},
        "watts": {"data": [200, 210, 220, 230, 240, 250]},
        "moving": {"data": [True] * 6},
    }
    s = map_streams(streams)
    assert s is not None and s["sampleCount"] == 4 and s["resolutionHz"] == 1.0
    assert s["timeS"] == [0.0, 1.0, 2.0, 4.0]
    assert s["latitude"] == [47.0, 47.1, 47.25, "NaN"]  # a gap: protojson's NaN, as core's parser wants it
    assert s["heartRateBpm"] == [100, 0, 121, 0]
    assert s["altitudeM"][:3] == [400.0, 401.0, 403.0] and s["altitudeM"][3] == 405.5
    assert s["powerW"] == [200, 210, 230, 250]
    assert s["channels"] == ["STREAM_CHANNEL_LATITUDE", "STREAM_CHANNEL_LONGITUDE",
                             "STREAM_CHANNEL_ALTITUDE", "STREAM_CHANNEL_HEART_RATE",
                             "STREAM_CHANNEL_POWER"]
    assert map_streams({"heartrate": {"data": [1, 2]}}) is None
    assert map_streams({"time": {"data": []}}) is None


# ---------------------------------------------------------------- usage headers


def test_usage_headers_prefer_read_budget_and_fall_back() -> None:
    now = datetime(2026, 3, 1, 12, 7, 30, tzinfo=UTC)
    both = {"X-RateLimit-Limit": "200,2000", "X-RateLimit-Usage": "50,700",
            "x-readratelimit-limit": "100,1000", "x-readratelimit-usage": "31,420"}
    short, daily = parse_usage(both, now)
    assert (short.window, short.limit, short.used, short.remaining) == ("short", 100, 31, 69)
    assert short.reset_at == datetime(2026, 3, 1, 12, 15, tzinfo=UTC)
    assert (daily.window, daily.limit, daily.used) == ("daily", 1000, 420)
    assert daily.reset_at == datetime(2026, 3, 2, tzinfo=UTC)
    malformed_read = dict(both, **{"x-readratelimit-usage": "abc"})
    assert [w.limit for w in parse_usage(malformed_read, now)] == [200, 2000]
    assert parse_usage({}, now) == [] and parse_usage({"X-RateLimit-Limit": "1"}, now) == []


@pytest.mark.parametrize(("now", "short", "daily"), [
    ("2026-03-01T12:00:00", "2026-03-01T12:15:00", "2026-03-02T00:00:00"),
    ("2026-03-01T12:14:59.9", "2026-03-01T12:15:00", "2026-03-02T00:00:00"),
    ("2026-03-01T23:52:00", "2026-03-02T00:00:00", "2026-03-02T00:00:00"),
    ("2026-12-31T23:59:59", "2027-01-01T00:00:00", "2027-01-01T00:00:00"),
])
def test_window_resets_are_on_the_clock(now: str, short: str, daily: str) -> None:
    at = datetime.fromisoformat(now).replace(tzinfo=UTC)
    assert next_short_reset(at) == datetime.fromisoformat(short).replace(tzinfo=UTC)
    assert next_daily_reset(at) == datetime.fromisoformat(daily).replace(tzinfo=UTC)
    # a non-UTC clock lands on the same instants
    assert next_short_reset(at.astimezone(timezone_plus(5, 30))) == next_short_reset(at)


def timezone_plus(hours: int, minutes: int):  # type: ignore[no-untyped-def]
    from datetime import timezone

    return timezone(timedelta(hours=hours, minutes=minutes))


def test_429_window_choice_and_retry_after() -> None:
    now = datetime(2026, 3, 1, 12, 7, 30, tzinfo=UTC)
    spent_daily = {"X-ReadRateLimit-Limit": "100,1000", "X-ReadRateLimit-Usage": "12,1000"}
    exc = rate_limited_from_429(spent_daily, now)
    assert exc.window == "daily" and exc.reset_at == datetime(2026, 3, 2, tzinfo=UTC)
    exc = rate_limited_from_429({"X-ReadRateLimit-Limit": "100,1000",
                                 "X-ReadRateLimit-Usage": "100,400"}, now)
    assert exc.window == "short" and exc.reset_at == datetime(2026, 3, 1, 12, 15, tzinfo=UTC)
    assert exc.delay_s(now) == pytest.approx(7 * 60 + 30 + 5)
    exc = rate_limited_from_429({"Retry-After": "42"}, now)
    assert exc.reset_at == now + timedelta(seconds=42)


# ---------------------------------------------------------------- against fake Strava


def test_fetch_source_emits_gear_before_activity_and_archives(strava: FakeStrava, http: httpx.Client,
                                                              provider: StravaProvider) -> None:
    act = activity_with_gear(strava)
    hook = RecordingHook()
    out = provider.fetch_source(ctx_for(strava, http, hook), Job(ext_id=str(act["id"])))
    assert [e["type"] for e in out.wire_events] == ["WORKER_EVENT_TYPE_GEAR", "WORKER_EVENT_TYPE_ACTIVITY"]
    gear = out.wire_events[0]["gear"]
    assert gear["ref"] == {"userId": USER_ID, "provider": "strava", "externalId": act["gear_id"],
                           "externalAccountId": ACCOUNT_ID}
    assert gear["payload"]["brand"] in ("Canyon", "Hoka")
    imported = out.activity
    assert imported["ref"]["externalId"] == str(act["id"]) and out.ext_id == str(act["id"])
    assert imported["payload"]["gearExternalId"] == act["gear_id"]
    assert imported["stream"]["sampleCount"] == len(strava.athlete(ATHLETE).streams[act["id"]]["time"]["data"])
    assert out.archive is not None and out.archive.dataset == 1 and out.gear_errors == 0
    envelope = json.loads(out.archive.body)
    assert envelope["version"] == 1 and envelope["activity"]["id"] == act["id"]
    assert envelope["provenance"]["worker_name"] == "strava-test" and "time" in envelope["streams"]
    assert envelope["gear"][0]["id"] == act["gear_id"]
    # every call reserved daily + short, every response synced the limiter
    assert hook.reserved and all(w == ("daily", "short") for w in hook.reserved)
    assert len(hook.observed) == len(hook.reserved)
    assert {w.window for w in hook.observed[0]} == {"short", "daily"}
    out.attach_raw_blob("users/u/strava/uploads/x", size_bytes=out.archive.size_bytes,
                        content_type="application/json")
    assert out.activity["rawBlobId"] == "users/u/strava/uploads/x"


def test_a_gap_in_the_streams_is_imported_as_nan_and_parses_strictly(strava: FakeStrava, http: httpx.Client,
                                                                     provider: StravaProvider) -> None:
    """A GPS and altimeter dropout: Strava sends ``null`` samples. They stay gaps (NaN, core's per-sample
    marker in a float column), written as protojson's ``"NaN"`` so core's strict parser takes them; a bare
    float NaN is refused by ``json_format.ParseDict`` and the whole import failed."""
    act = activity_with_gear(strava)
    gap = range(10, 20)
    blank_samples(strava.athlete(ATHLETE), act["id"], ("latlng", "altitude", "heartrate"), gap)
    job = Job(ext_id=str(act["id"]))
    out = provider.fetch_source(ctx_for(strava, http), job)
    (activity,) = [e.activity for e in out.events if e.HasField("activity")]  # strict, as core parses
    for column in (activity.stream.latitude, activity.stream.longitude, activity.stream.altitude_m):
        assert [math.isnan(v) for v in column[8:22]] == [False] * 2 + [True] * 10 + [False] * 2
    assert list(activity.stream.heart_rate_bpm[10:20]) == [0] * 10  # int columns are dense: 0, never NaN
    assert out.activity["stream"]["altitudeM"][10] == "NaN"
    assert out.archive is not None
    reparsed = provider.parse_blob(bytes(out.archive.body), job)  # the archive keeps Strava's nulls
    assert ([e.SerializeToString(deterministic=True) for e in reparsed.events]
            == [e.SerializeToString(deterministic=True) for e in out.events])


def test_parse_blob_of_the_archive_is_byte_identical(strava: FakeStrava, http: httpx.Client,
                                                     provider: StravaProvider) -> None:
    act = activity_with_gear(strava)
    job = Job(ext_id=str(act["id"]))
    imported = provider.fetch_source(ctx_for(strava, http), job)
    assert imported.archive is not None
    reparsed = StravaProvider(StravaSettings(base_url="https://unused.example")).parse_blob(
        bytes(imported.archive.body), Job(ext_id=""))  # ext id recovered from the archive
    dump = lambda events: json.dumps(events, sort_keys=True).encode()  # noqa: E731
    assert dump(reparsed.wire_events) == dump(imported.wire_events)
    assert reparsed.archive is None
    pb = pytest.importorskip("workers.cairn.contract.pb")
    assert pb is not None
    assert ([e.SerializeToString(deterministic=True) for e in reparsed.events]
            == [e.SerializeToString(deterministic=True) for e in imported.events])


def test_older_archive_without_gear_and_other_datasets() -> None:
    raw = build_archive({"id": 77, "sport_type": "Run", "start_date": "2024-01-01T10:00:00Z",
                         "elapsed_time": 100, "gear_id": "g1"}, None, [])
    ext_id, events = parse_archive(raw, user_id=USER_ID, account_id=ACCOUNT_ID)
    assert ext_id == "77" and [e["type"] for e in events] == ["WORKER_EVENT_TYPE_ACTIVITY"]
    assert events[0]["activity"]["payload"]["gearExternalId"] == "g1" and "stream" not in events[0]["activity"]
    legacy = json.dumps({"version": "1", "activity": {"id": 5, "start_date": "2024-01-01T10:00:00Z",
                                                      "elapsed_time": 3}}).encode()
    assert parse_archive(legacy, user_id=USER_ID, account_id="")[0] == "5"
    with pytest.raises(UnsupportedDataset) as info:
        parse_archive(json.dumps({"version": 2, "activity": {"id": 1}}).encode(),
                      user_id=USER_ID, account_id=ACCOUNT_ID)
    assert isinstance(info.value, RetryableJobError)  # NAK: a pool that reads dataset 2 takes it


@pytest.mark.parametrize(("activity", "problems"), [
    ({"id": 6, "elapsed_time": 30}, ["no start time"]),
    ({"id": 6, "start_date": "not a date", "elapsed_time": 30}, ["no start time"]),
    ({"id": 6, "start_date": "1970-01-01T00:00:00Z", "elapsed_time": 30}, ["no start time"]),  # core's zero
    ({"id": 6, "start_date": "2024-01-01T10:00:00Z"}, ["elapsed time not above zero"]),
    ({"id": 6, "start_date": "2024-01-01T10:00:00Z", "elapsed_time": -5}, ["elapsed time not above zero"]),
    ({"id": 6}, ["no start time", "elapsed time not above zero"]),
])
def test_an_activity_core_cannot_ingest_is_unmappable(activity: dict, problems: list[str]) -> None:
    """Reference §2.7/§1.12: core requires a non-zero start and elapsed > 0; a permanent error, not a result."""
    assert ingest_problems(map_activity(StravaActivity.model_validate(activity))) == problems
    with pytest.raises(UnmappableActivity) as info:
        parse_archive(build_archive(activity, None, []), user_id=USER_ID, account_id=ACCOUNT_ID)
    assert isinstance(info.value, ProviderPermanentError) and info.value.code == "unmappable"
    assert all(p in str(info.value) for p in problems)


@pytest.mark.parametrize("status", [500, 404, 429])
def test_gear_failure_never_fails_the_import(strava: FakeStrava, http: httpx.Client, status: int) -> None:
    fresh = StravaProvider(StravaSettings(base_url=strava.base_url))  # empty gear cache
    act = activity_with_gear(strava)
    strava.fail("gear", status)
    out = fresh.fetch_source(ctx_for(strava, http), Job(ext_id=str(act["id"])))
    assert [e["type"] for e in out.wire_events] == ["WORKER_EVENT_TYPE_ACTIVITY"]
    assert out.gear_errors == 1
    assert out.activity["payload"]["gearExternalId"] == act["gear_id"]
    assert out.activity["payload"]["gearName"] == act["gear"]["name"]  # display hint from the activity
    assert "gear" not in json.loads(out.archive.body)  # type: ignore[union-attr]


def test_gear_budget_denied_is_skipped_too(strava: FakeStrava, http: httpx.Client) -> None:
    fresh = StravaProvider(StravaSettings(base_url=strava.base_url))
    act = activity_with_gear(strava)
    out = fresh.fetch_source(ctx_for(strava, http, RecordingHook(deny_after=2)), Job(ext_id=str(act["id"])))
    assert out.gear_errors == 1 and len(out.wire_events) == 1


def test_429_raises_rate_limited_anchored_to_the_window(strava: FakeStrava, http: httpx.Client,
                                                        provider: StravaProvider) -> None:
    act_id = str(next(iter(strava.athlete(ATHLETE).activities)))
    hook = RecordingHook()
    strava.force_429(window="short")
    before = datetime.now(UTC)
    with pytest.raises(ProviderRateLimited) as info:
        provider.fetch_source(ctx_for(strava, http, hook), Job(ext_id=act_id))
    assert info.value.window == "short" and isinstance(info.value, RetryableJobError)
    assert info.value.reset_at in (next_short_reset(before), next_short_reset(datetime.now(UTC)))
    assert info.value.reset_at.minute % 15 == 0 and info.value.reset_at.second == 0
    assert hook.observed and hook.observed[-1]  # usage synced from the 429 itself
    strava.force_429(window="daily")
    with pytest.raises(ProviderRateLimited) as info:
        provider.fetch_source(ctx_for(strava, http), Job(ext_id=act_id))
    assert info.value.window == "daily" and info.value.reset_at == next_daily_reset(datetime.now(UTC))
    strava.force_429(window="short", retry_after_s=90)
    with pytest.raises(ProviderRateLimited) as info:
        provider.fetch_source(ctx_for(strava, http), Job(ext_id=act_id))
    assert 80 <= (info.value.reset_at - datetime.now(UTC)).total_seconds() <= 91


def test_status_mapping(strava: FakeStrava, http: httpx.Client, provider: StravaProvider) -> None:
    with pytest.raises(ProviderNotFound) as info:
        provider.fetch_source(ctx_for(strava, http), Job(ext_id="999"))
    assert info.value.code == "not_found" and info.value.error_class == "ERROR_CLASS_NOT_FOUND"
    with pytest.raises(ProviderAuthError) as auth:
        provider.fetch_source(ProviderContext(access_token="not-a-valid-token-123", http=http),
                              Job(ext_id="1"))
    assert auth.value.code == "needs_reauth" and isinstance(auth.value, PermanentJobError)
    act_id = str(next(iter(strava.athlete(ATHLETE).activities)))
    strava.fail("activity", 503)
    with pytest.raises(RetryableJobError):
        provider.fetch_source(ctx_for(strava, http), Job(ext_id=act_id))
    strava.fail("streams", 404)  # no stream is not an error
    out = provider.fetch_source(ctx_for(strava, http), Job(ext_id=act_id))
    assert "stream" not in out.activity
    with pytest.raises(PermanentJobError):
        provider.fetch_source(ctx_for(strava, http), Job(ext_id="../athlete"))


def test_list_activities_paginates_with_window_limit_and_exclude(strava: FakeStrava, http: httpx.Client,
                                                                 provider: StravaProvider) -> None:
    athlete = 5151
    strava.add_athlete(athlete, n_activities=230, with_gear=False)
    ctx = ctx_for(strava, http, athlete=athlete)
    strava.clear_requests()
    refs = provider.list_activities(ctx, after=None)
    pages = [r for r in strava.requests if r.endpoint == "list_activities"]
    assert len(refs) == 230 and len({r.ext_id for r in refs}) == 230
    assert [int(r.query["page"]) for r in pages] == [1, 2, 3]
    assert all(r.query["per_page"] == "100" for r in pages)
    ids = [r.ext_id for r in refs]
    limited = provider.list_activities(ctx, after=None, limit=150, exclude=ids[:120])
    assert [r.ext_id for r in limited] == ids[120:230][:110]  # limit never reached: all new ones
    limited = provider.list_activities(ctx, after=None, limit=5, exclude=ids[:2])
    assert [r.ext_id for r in limited] == ids[2:7]
    newest = max(r.start_time for r in refs)
    window = provider.list_activities(ctx, after=newest - timedelta(days=3))
    assert window and all(r.start_time > newest - timedelta(days=3) for r in window)
    assert all(r.start_time.tzinfo is not None for r in window)


def test_discover_pages_and_rate_limits(strava: FakeStrava, http: httpx.Client,
                                        provider: StravaProvider) -> None:
    athlete = 6161
    strava.add_athlete(athlete, n_activities=450, with_gear=False)
    reply = provider.discover(ctx_for(strava, http, athlete=athlete), DiscoverRequest(start_page=1))
    assert reply.complete and len(reply.items) == 450 and reply.error is None
    assert reply.items[0].item_type == "activity" and reply.items[0].item_time.endswith("Z")
    assert reply.to_wire().keys() == {"items", "complete"}
    # budget gone after the first page: a partial, rate-limited reply naming where to resume
    partial = provider.discover(ctx_for(strava, http, RecordingHook(deny_after=1), athlete),
                                DiscoverRequest(start_page=1))
    assert len(partial.items) == 200 and partial.rate_limited and partial.next_page == 2
    assert not partial.complete
    none = provider.discover(ctx_for(strava, http, RecordingHook(deny_after=0), athlete),
                             DiscoverRequest(start_page=1))
    assert none.error and "rate_limited" in none.error and not none.items
    strava.fail("list_activities", 500)
    failed = provider.discover(ctx_for(strava, http, athlete=athlete), DiscoverRequest(start_page=2))
    assert failed.error and failed.to_wire()["items"] == []


def test_import_gear_lists_every_gear_including_retired(strava: FakeStrava, http: httpx.Client,
                                                        provider: StravaProvider) -> None:
    events = provider.import_gear(ctx_for(strava, http), Job())
    gear = {e["gear"]["ref"]["externalId"]: e["gear"]["payload"] for e in events}
    assert set(gear) == set(strava.athlete(ATHLETE).gear)
    assert sum(1 for g in gear.values() if g.get("retired")) == 2
    assert all(e["type"] == "WORKER_EVENT_TYPE_GEAR" for e in events)
    assert {g["kind"] for g in gear.values()} == {"bike", "shoes"}


def test_oauth_exchange_returns_athlete_id(strava: FakeStrava, http: httpx.Client,
                                           provider: StravaProvider) -> None:
    code = strava.issue_code(ATHLETE)
    tokens = provider.exchange_oauth(http, client_id=strava.client_id, client_secret=strava.client_secret,
                                     code=code, redirect_uri="https://cairn.example/auth/oauth/strava/callback")
    assert tokens.provider_account_id == str(ATHLETE)
    assert tokens.access_token == strava.athlete(ATHLETE).access_token and tokens.refresh_token
    assert tokens.expires_at > datetime.now(UTC) + timedelta(hours=5)
    wire = tokens.to_wire()
    assert wire["expires_at"].endswith("Z") and wire["provider_account_id"] == str(ATHLETE)
    with pytest.raises(ProviderAuthError):  # a code works once
        provider.exchange_oauth(http, client_id=strava.client_id, client_secret=strava.client_secret,
                                code=code, redirect_uri="x")
    refreshed = provider.refresh_oauth(http, client_id=strava.client_id, client_secret=strava.client_secret,
                                       refresh_token=tokens.refresh_token)
    assert refreshed.access_token


def test_secrets_never_reach_logs_or_exceptions(strava: FakeStrava, http: httpx.Client,
                                                provider: StravaProvider,
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    token = strava.athlete(ATHLETE).access_token
    texts: list[str] = []
    act = activity_with_gear(strava)
    ctx = ctx_for(strava, http)
    texts.append(repr(ctx))
    strava.fail("gear", 500)
    StravaProvider(StravaSettings(base_url=strava.base_url)).fetch_source(ctx, Job(ext_id=str(act["id"])))
    for failure in ("activity", 500), ("activity", 401), ("activity", 403):
        strava.fail(*failure)
        with pytest.raises(Exception) as info:
            provider.fetch_source(ctx, Job(ext_id=str(act["id"])))
        texts += [str(info.value), repr(info.value)]
    bad_secret = "wrong-" + strava.client_secret
    code = strava.issue_code(ATHLETE)
    with pytest.raises(ProviderAuthError) as info:
        provider.exchange_oauth(http, client_id=strava.client_id, client_secret=bad_secret,
                                code=code, redirect_uri="x")
    texts += [str(info.value), repr(info.value)]
    tokens = provider.exchange_oauth(http, client_id=strava.client_id, client_secret=strava.client_secret,
                                     code=code, redirect_uri="x")
    texts.append(repr(tokens))
    blob = "\n".join(texts) + caplog.text
    for secret in (token, strava.client_secret, bad_secret, code, tokens.access_token, tokens.refresh_token):
        assert secret not in blob


def test_registry_builds_strava_and_refuses_unknown(strava: FakeStrava,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_STRAVA_BASE_URL", strava.base_url)
    provider = get_provider("strava")
    assert isinstance(provider, StravaProvider) and provider.settings.base_url == strava.base_url
    meta = provider.manifest_meta()
    assert meta["auth_method"] == "oauth2" and meta["oauth"]["scope_separator"] == ","
    assert meta["oauth"]["authorize_url"] == strava.base_url + "/oauth/authorize"
    assert {f["key"] for f in meta["config_fields"]} == {"client_id", "client_secret"}
    caps = provider.declared_capabilities()
    assert {"fetch_source", "reconcile", "parse_blob", "import_gear"} == set(caps.jobs)
    assert "import_metrics" not in caps.jobs and "Gear" in caps.data_types
    monkeypatch.setenv("CAIRN_STRAVA_BASE_URL", "ftp://nope")
    with pytest.raises(ConfigError, match="CAIRN_STRAVA_BASE_URL"):
        get_provider("strava")
    with pytest.raises(ConfigError):
        get_provider("garmin-does-not-exist")
