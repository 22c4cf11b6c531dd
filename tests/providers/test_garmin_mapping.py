"""Garmin FIT → Cairn mapping, on FIT files written by an independent encoder (fit-tool).

The parser under test decodes with fitdecode; every file
here is written with fit-tool, so an encoder and a decoder cannot share a bug.
What must hold: sport and sub-sport, start time and time zone, distance,
moving and elapsed time, elevation, calories, device, laps and the record
streams (time, position, altitude, heart rate, cadence, power, speed,
temperature, with gaps and duplicate samples cleaned), gear; the output parses
strictly as ``cairn.worker.v1`` protos; corrupt, truncated and foreign files
are permanent failures, never a crash.
"""

from __future__ import annotations

import io
import math
import zipfile
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fit_tool.fit_file_builder import FitFileBuilder
from fit_tool.profile.messages.activity_message import ActivityMessage
from fit_tool.profile.messages.device_info_message import DeviceInfoMessage
from fit_tool.profile.messages.file_id_message import FileIdMessage
from fit_tool.profile.messages.lap_message import LapMessage
from fit_tool.profile.messages.record_message import RecordMessage
from fit_tool.profile.messages.session_message import SessionMessage
from fit_tool.profile.profile_type import FileType, Manufacturer, Sport, SubSport

from workers.providers.errors import ProviderPermanentError, UnsupportedDataset
from workers.providers.garmin.dataset import CorruptArchive, UnmappableActivity, build_archive, parse_dataset
from workers.providers.garmin.fit import CorruptFit, UnsupportedFile, fit_from_download
from workers.providers.garmin.mapping import classify_sport
from workers.providers.protos import worker_events

START = datetime(2026, 6, 14, 5, 30, 0, tzinfo=UTC)
FIT_EPOCH_UNIX = 631065600
GEAR = [{"uuid": "g-42", "displayName": "Daily trainers", "gearMakeName": "Asics", "gearModelName": "Novablast",
         "gearTypeName": "Shoes", "gearStatusName": "retired"}]


def _ms(offset_s: float) -> int:
    return int((START + timedelta(seconds=offset_s)).timestamp() * 1000)


def write_fit(sport: Sport = Sport.RUNNING, sub_sport: SubSport = SubSport.TRAIL, *, records: list[dict[str, Any]]
              | None = None, elapsed: float = 40.0, utc_offset_s: int | None = 7200, **session: Any) -> bytes:
    builder = FitFileBuilder(auto_define=True, min_string_size=50)
    file_id = FileIdMessage()
    file_id.type, file_id.manufacturer, file_id.product = FileType.ACTIVITY, Manufacturer.GARMIN.value, 3113
    file_id.time_created, file_id.serial_number = _ms(0), 1234
    builder.add(file_id)
    device = DeviceInfoMessage()
    device.timestamp, device.device_index, device.software_version = _ms(0), 0, 19.5
    builder.add(device)
    for values in records if records is not None else _default_records():
        record = RecordMessage()
        for key, value in values.items():
            setattr(record, key, _ms(value) if key == "timestamp" else value)
        builder.add(record)
    half = min(20.0, elapsed)
    for n, (begin, end) in enumerate(((0.0, half), (half, elapsed))):
        lap = LapMessage()
        lap.timestamp, lap.start_time = _ms(end), _ms(begin)
        lap.total_elapsed_time, lap.total_timer_time = end - begin, max(0.0, end - begin - 1)
        lap.total_distance = 60.0 + n
        lap.avg_heart_rate, lap.max_heart_rate, lap.avg_power, lap.avg_cadence = 140 + n, 150, 250, 88
        lap.total_ascent = 3 + n
        builder.add(lap)
    s = SessionMessage()
    s.timestamp, s.start_time, s.sport, s.sub_sport = _ms(elapsed), _ms(0), sport, sub_sport
    s.total_elapsed_time, s.total_timer_time, s.total_distance = elapsed, max(0.0, elapsed - 5), 121.5
    s.total_ascent, s.total_descent, s.total_calories = 7, 4, 33
    s.avg_heart_rate, s.max_heart_rate, s.avg_power, s.max_power, s.normalized_power = 142, 151, 251, 320, 260
    s.avg_speed, s.max_speed, s.avg_cadence, s.max_cadence = 3.04, 3.9, 88, 95
    s.avg_temperature, s.max_temperature = 18, 21
    for key, value in session.items():
        setattr(s, key, value)
    builder.add(s)
    if utc_offset_s is not None:
        act = ActivityMessage()
        act.timestamp, act.num_sessions = _ms(elapsed), 1
        act.local_timestamp = int(START.timestamp()) + int(elapsed) + utc_offset_s - FIT_EPOCH_UNIX
        builder.add(act)
    return builder.build().to_bytes()


def _default_records() -> list[dict[str, Any]]:
    rows = []
    for t in range(0, 41, 5):
        row = {"timestamp": t, "position_lat": 46.5 + t * 1e-5, "position_long": 6.6, "altitude": 372.0 + t / 10,
               "heart_rate": 130 + t // 5, "cadence": 88, "power": 240 + t, "speed": 3.0, "temperature": 18,
               "distance": 3.0 * t}
        if t == 10:
            del row["position_lat"], row["position_long"], row["heart_rate"]  # a GPS and HR dropout
        rows.append(row)
    rows.insert(3, dict(rows[2], heart_rate=199))  # a duplicate sample at t=10: the last one wins
    return rows


def parse(fit: bytes, summary: dict[str, Any] | None = None, gear: list[dict[str, Any]] | None = None,
          ext_id: str = "555") -> list[dict[str, Any]]:
    raw = build_archive(ext_id, summary or {}, gear or [], fit)
    events = parse_dataset(raw, user_id="u-1", account_id="a-1").events
    worker_events(events)  # strictly parsed: a field outside the contract fails here
    return events


def test_a_run_maps_every_field_from_the_fit_file_and_the_summary() -> None:
    summary = {"activityName": "Lakeside", "description": "easy", "activityTypeDTO": {"typeKey": "trail_running"},
               "timeZoneUnitDTO": {"timeZone": "Europe/Zurich"}, "eventTypeDTO": {"typeKey": "race"}}
    gear_event, activity_event = parse(write_fit(), summary, GEAR)
    assert gear_event["gear"] == {"ref": {"userId": "u-1", "provider": "garmin", "externalId": "g-42",
                                          "externalAccountId": "a-1"},
                                  "payload": {"name": "Daily trainers", "brand": "Asics", "model": "Novablast",
                                              "kind": "shoes", "retired": True}}
    activity = activity_event["activity"]
    assert activity["ref"]["externalId"] == "555"
    p = activity["payload"]
    assert (p["type"], p["discipline"], p["providerNativeType"]) == ("ACTIVITY_TYPE_RUN", "DISCIPLINE_RUN_TRAIL",
                                                                     "trail_running")
    assert (p["title"], p["description"], p["isRace"]) == ("Lakeside", "easy", True)
    assert (p["startTime"], p["endTime"]) == ("2026-06-14T05:30:00Z", "2026-06-14T05:30:40Z")
    assert (p["elapsedDuration"], p["movingDuration"], p["timezone"]) == ("40s", "35s", "Europe/Zurich")
    assert p["summary"] == {"distanceM": 121.5, "elevationGainM": 7.0, "elevationLossM": 4.0,
                            "minElevationM": 372.0, "maxElevationM": 376.0, "avgSpeedMps": 3.04,
                            "maxSpeedMps": 3.9, "avgHeartRateBpm": 142, "maxHeartRateBpm": 151, "avgPowerW": 251,
                            "maxPowerW": 320, "normalizedPowerW": 260, "avgCadence": 88, "maxCadence": 95,
                            "avgTemperatureC": 18.0, "maxTemperatureC": 21.0, "caloriesKcal": 33}
    assert p["extra"] == {"device": "garmin fr945", "device_software": "19.5"}
    assert (p["gearExternalId"], p["gearName"]) == ("g-42", "Daily trainers")
    first, second = p["laps"]
    assert first == {"index": 1, "startTime": "2026-06-14T05:30:00Z", "elapsedDuration": "20s",
                     "movingDuration": "19s", "distanceM": 60.0, "avgHeartRateBpm": 140, "maxHeartRateBpm": 150,
                     "avgPowerW": 250, "avgCadence": 88, "elevationGainM": 3.0}
    assert (second["index"], second["startTime"], second["distanceM"]) == (2, "2026-06-14T05:30:20Z", 61.0)


def test_the_record_stream_keeps_every_channel_cleans_duplicates_and_marks_gaps() -> None:
    stream = parse(write_fit())[-1]["activity"]["stream"]
    assert stream["timeS"] == [0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0]  # strictly increasing
    assert stream["sampleCount"] == 9 and stream["resolutionHz"] == 1.0
    assert stream["channels"] == ["STREAM_CHANNEL_LATITUDE", "STREAM_CHANNEL_LONGITUDE", "STREAM_CHANNEL_ALTITUDE",
                                  "STREAM_CHANNEL_DISTANCE", "STREAM_CHANNEL_SPEED", "STREAM_CHANNEL_HEART_RATE",
                                  "STREAM_CHANNEL_POWER", "STREAM_CHANNEL_CADENCE", "STREAM_CHANNEL_TEMPERATURE"]
    assert stream["latitude"][0] == pytest.approx(46.5, abs=1e-6) and stream["longitude"][1] == pytest.approx(6.6)
    assert stream["latitude"][2] == stream["longitude"][2] == "NaN"  # the GPS gap: protojson's NaN
    assert math.isnan(worker_events([parse(write_fit())[-1]])[0].activity.stream.latitude[2])
    assert stream["heartRateBpm"][2] == 199  # the duplicate at t=10 replaced the gap sample (last wins)
    assert stream["heartRateBpm"][:2] == [130, 131] and stream["powerW"][-1] == 280
    assert stream["altitudeM"][-1] == pytest.approx(376.0) and stream["speedMps"][0] == pytest.approx(3.0)
    assert stream["cadence"][0] == 88 and stream["temperatureC"][0] == 18.0 and stream["distanceM"][-1] == 120.0


def test_an_int_channel_gap_is_a_dense_zero_and_absent_channels_are_left_out() -> None:
    records = [{"timestamp": 0, "heart_rate": 120}, {"timestamp": 1}, {"timestamp": 2, "heart_rate": 122}]
    stream = parse(write_fit(records=records, elapsed=2.0))[-1]["activity"]["stream"]
    assert stream["heartRateBpm"] == [120, 0, 122] and stream["channels"] == ["STREAM_CHANNEL_HEART_RATE"]
    assert "latitude" not in stream and "powerW" not in stream


@pytest.mark.parametrize(("sport", "sub_sport", "expected"), [
    (Sport.RUNNING, SubSport.TRACK, ("ACTIVITY_TYPE_RUN", "DISCIPLINE_RUN_TRACK", None, None)),
    (Sport.CYCLING, SubSport.MOUNTAIN, ("ACTIVITY_TYPE_RIDE", "DISCIPLINE_RIDE_MTB", None, None)),
    (Sport.CYCLING, SubSport.GRAVEL_CYCLING, ("ACTIVITY_TYPE_RIDE", "DISCIPLINE_RIDE_GRAVEL", None, None)),
    (Sport.CYCLING, SubSport.VIRTUAL_ACTIVITY, ("ACTIVITY_TYPE_RIDE", "DISCIPLINE_RIDE_ROAD", True, None)),
    (Sport.E_BIKING, SubSport.E_BIKE_MOUNTAIN, ("ACTIVITY_TYPE_RIDE", "DISCIPLINE_RIDE_MTB", None, True)),
    (Sport.SWIMMING, SubSport.LAP_SWIMMING, ("ACTIVITY_TYPE_SWIM", "DISCIPLINE_SWIM_POOL", None, None)),
    (Sport.SWIMMING, SubSport.OPEN_WATER, ("ACTIVITY_TYPE_SWIM", "DISCIPLINE_SWIM_OPEN_WATER", None, None)),
    (Sport.ALPINE_SKIING, SubSport.BACKCOUNTRY, ("ACTIVITY_TYPE_SKI", "DISCIPLINE_SKI_BACKCOUNTRY", None, None)),
    (Sport.CROSS_COUNTRY_SKIING, SubSport.SKATE_SKIING, ("ACTIVITY_TYPE_SKI", "DISCIPLINE_SKI_NORDIC", None, None)),
    (Sport.FITNESS_EQUIPMENT, SubSport.ELLIPTICAL, ("ACTIVITY_TYPE_ELLIPTICAL", None, None, None)),
    (Sport.ROWING, SubSport.INDOOR_ROWING, ("ACTIVITY_TYPE_ROW", None, None, None)),
    (Sport.HIKING, SubSport.GENERIC, ("ACTIVITY_TYPE_HIKE", None, None, None)),
    (Sport.STAND_UP_PADDLEBOARDING, SubSport.GENERIC, ("ACTIVITY_TYPE_SUP", None, None, None)),
])
def test_sport_and_sub_sport_from_the_fit_session(sport: Sport, sub_sport: SubSport,
                                                  expected: tuple[Any, ...]) -> None:
    payload = parse(write_fit(sport, sub_sport))[-1]["activity"]["payload"]
    got = (payload["type"], payload.get("discipline"), payload.get("isVirtual"), payload.get("isEbike"))
    assert got == expected


def test_an_unknown_sport_is_a_workout_named_by_its_type() -> None:
    assert classify_sport("boxing", "generic") == ("WORKOUT", "", False, False)
    payload = parse(write_fit(Sport.BOXING, SubSport.GENERIC))[-1]["activity"]["payload"]
    assert (payload["type"], payload["customSubtype"]) == ("ACTIVITY_TYPE_WORKOUT", "boxing")


def test_without_a_connect_zone_the_fit_offset_names_the_zone() -> None:
    assert parse(write_fit(utc_offset_s=-5 * 3600))[-1]["activity"]["payload"]["timezone"] == "Etc/GMT+5"
    assert parse(write_fit(utc_offset_s=None))[-1]["activity"]["payload"]["timezone"] == "UTC"


def test_parse_is_deterministic_and_reads_connects_zip_or_a_bare_fit() -> None:
    fit = write_fit()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("555_ACTIVITY.fit", fit)
    assert fit_from_download(buffer.getvalue()) == fit_from_download(fit) == fit
    raw = build_archive("555", {}, GEAR, fit, archived_at=START)
    assert raw == build_archive("555", {}, GEAR, fit, archived_at=START)  # same inputs, same bytes
    assert parse_dataset(raw, user_id="u", account_id="a") == parse_dataset(raw, user_id="u", account_id="a")


def _zip(name: str, body: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr(name, body)
    return buffer.getvalue()


@pytest.mark.parametrize(("download", "error"), [
    (b"<html>maintenance</html>", CorruptFit),
    (_zip("1_ACTIVITY.gpx", b"<gpx/>"), UnsupportedFile),
    (_zip("readme.txt", b"hi"), CorruptFit),
    (b"PK\x03\x04broken zip", CorruptFit),
])
def test_a_foreign_or_broken_download_is_permanent(download: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        fit_from_download(download)


@pytest.mark.parametrize("damage", ["truncated", "crc", "garbage"])
def test_a_corrupt_fit_is_a_permanent_failure_never_a_crash(damage: str) -> None:
    fit = write_fit()
    bad = {"truncated": fit[: len(fit) // 2], "crc": fit[:-1] + bytes([fit[-1] ^ 0xFF]),
           "garbage": fit[:14] + b"\xff" * (len(fit) - 14)}[damage]
    with pytest.raises(CorruptFit) as err:
        parse(bad)
    assert isinstance(err.value, ProviderPermanentError) and err.value.code == "corrupt_fit"


def test_archives_that_cannot_be_read_or_mapped() -> None:
    with pytest.raises(CorruptArchive):
        parse_dataset(b"not a zip", user_id="u", account_id="a")
    newer = io.BytesIO()
    with zipfile.ZipFile(newer, "w") as z:
        z.writestr("archive.json", '{"version": 2}')
    with pytest.raises(UnsupportedDataset):  # another dataset: NAKed for a pool that reads it
        parse_dataset(newer.getvalue(), user_id="u", account_id="a")
    with pytest.raises(UnmappableActivity):  # core could never ingest an activity without a duration
        parse(write_fit(elapsed=0.0, records=[{"timestamp": 0, "heart_rate": 100}]))
