"""The Strava provider's pure parts: activity and stream mapping, usage headers, the archive format.

No server here: what the provider reads from Strava's answers, in the shapes of the real API;
``test_provider_strava.py`` runs the same code against the fake Strava.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from workers.errors import RetryableJobError
from workers.providers.errors import ProviderPermanentError, UnsupportedDataset
from workers.providers.strava.dataset import UnmappableActivity, build_archive, parse_archive
from workers.providers.strava.mapping import classify_sport, ingest_problems, map_activity, map_streams
from workers.providers.strava.models import StravaActivity
from workers.providers.strava.usage import (
    next_daily_reset,
    next_short_reset,
    parse_usage,
    rate_limited_from_429,
)

USER_ID = "7d1d9a8e-7a57-4a53-9b1e-1f0c0d7a0001"
ACCOUNT_ID = "0b6c2f0e-3c1a-4f5e-8a55-2a3f7d9e0002"


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
    assert next_short_reset(at.astimezone(timezone(timedelta(hours=5, minutes=30)))) == next_short_reset(at)


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
