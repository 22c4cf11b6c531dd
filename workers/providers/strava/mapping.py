"""Strava activity, streams and gear → Cairn protojson shapes (reference §4.3–4.5)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from workers.providers.protos import STREAM_GAP, activity_type_fields
from workers.providers.strava.models import StravaActivity, StravaGear, StravaLap

# sport_type → (ActivityType, Discipline or "", is_ebike, is_virtual); reference §4.4.
SPORT_TYPES: dict[str, tuple[str, str, bool, bool]] = {
    "Ride": ("RIDE", "RIDE_ROAD", False, False),
    "GravelRide": ("RIDE", "RIDE_GRAVEL", False, False),
    "MountainBikeRide": ("RIDE", "RIDE_MTB", False, False),
    "EMountainBikeRide": ("RIDE", "RIDE_MTB", True, False),
    "EBikeRide": ("RIDE", "RIDE_ROAD", True, False),
    "VirtualRide": ("RIDE", "RIDE_ROAD", False, True),
    "TrackRide": ("RIDE", "RIDE_TRACK", False, False),
    "Velomobile": ("RIDE", "RIDE_TRACK", False, False),
    "Run": ("RUN", "RUN_ROAD", False, False),
    "TrailRun": ("RUN", "RUN_TRAIL", False, False),
    "VirtualRun": ("RUN", "RUN_ROAD", False, True),
    "Hike": ("HIKE", "", False, False),
    "Walk": ("WALK", "", False, False),
    "Swim": ("SWIM", "", False, False),
    "AlpineSki": ("SKI", "SKI_ALPINE", False, False),
    "NordicSki": ("SKI", "SKI_NORDIC", False, False),
    "RollerSki": ("SKI", "SKI_NORDIC", False, False),
    "BackcountrySki": ("SKI", "SKI_BACKCOUNTRY", False, False),
    "Rowing": ("ROW", "", False, False),
    "VirtualRow": ("ROW", "", False, False),
    "Snowboard": ("SNOWBOARD", "", False, False),
    "Kayaking": ("KAYAK", "", False, False),
    "Canoeing": ("KAYAK", "", False, False),
    "StandUpPaddling": ("SUP", "", False, False),
    "Surfing": ("SURF", "", False, False),
    "Windsurf": ("SURF", "", False, False),
    "Kitesurf": ("SURF", "", False, False),
    "Golf": ("GOLF", "", False, False),
    "RockClimbing": ("CLIMB", "", False, False),
    "InlineSkate": ("SKATE", "", False, False),
    "IceSkate": ("SKATE", "", False, False),
    "Skateboard": ("SKATE", "", False, False),
    "Elliptical": ("ELLIPTICAL", "", False, False),
    "Wheelchair": ("WHEELCHAIR", "", False, False),
    "Handcycle": ("WHEELCHAIR", "", False, False),
    **{name: ("TENNIS", "", False, False) for name in
       ("Tennis", "Pickleball", "Squash", "Badminton", "Racquetball", "TableTennis")},
}
FALLBACK_TYPE = "WORKOUT"
RACE_WORKOUT_TYPE = {"RIDE": 11, "RUN": 1}
STREAM_RESOLUTION_HZ = 1.0
TZ_PREFIX = re.compile(r"^\(GMT[+-]\d{2}:\d{2}\)\s*")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # a start at or before it is core's "zero start_time"

# Strava stream key → (ActivityStream column, StreamChannel, is_int); order = channel order.
STREAM_COLUMNS: tuple[tuple[str, str, str, bool], ...] = (
    ("altitude", "altitudeM", "ALTITUDE", False),
    ("distance", "distanceM", "DISTANCE", False),
    ("velocity_smooth", "speedMps", "SPEED", False),
    ("heartrate", "heartRateBpm", "HEART_RATE", True),
    ("watts", "powerW", "POWER", True),
    ("cadence", "cadence", "CADENCE", True),
    ("temp", "temperatureC", "TEMPERATURE", False),
    ("grade_smooth", "grade", "GRADE", False),
)


def classify_sport(sport_type: str, legacy_type: str = "") -> tuple[str, str, bool, bool]:
    """(ActivityType, Discipline, e-bike, virtual) for a Strava sport; unknown → WORKOUT."""
    return SPORT_TYPES.get(sport_type or legacy_type, (FALLBACK_TYPE, "", False, False))


def parse_time(value: str) -> datetime | None:
    """Strava RFC 3339 (``…Z``) → aware UTC; None when unparseable."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def ts(value: datetime) -> str:
    """protojson Timestamp: RFC 3339 UTC with ``Z``."""
    text = value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond:06d}"
    return text + "Z"


def duration(seconds: float) -> str:
    """protojson Duration: decimal seconds with an ``s`` suffix (whole seconds from Strava)."""
    whole = int(seconds)
    return f"{whole}s" if whole == seconds else f"{seconds:.6f}s"


def _round(value: float) -> int:
    return int(value + 0.5)


def map_activity(activity: StravaActivity, gear: StravaGear | None = None) -> dict[str, Any]:
    """``cairn.v1.ActivitySourcePayload`` as a protojson dict.

    Dicts, not proto objects: pure data, testable without stubs; ``protos`` parses them strictly,
    so a field outside the contract fails in our tests, not at core. Reference rules: heart rate
    and power truncated in the summary but rounded in laps, calories fall back to kJ 1:1,
    ``is_race`` from ``RACE_WORKOUT_TYPE``, the summary always present.
    """
    sport = activity.sport_type
    kind, discipline, ebike, virtual = classify_sport(sport, activity.type)
    payload: dict[str, Any] = activity_type_fields(kind, discipline, ebike, virtual)
    if sport:
        payload["providerNativeType"] = sport
    if activity.name:
        payload["title"] = activity.name
    if activity.description:
        payload["description"] = activity.description
    start = parse_time(activity.start_date)
    if start is not None:
        payload["startTime"] = ts(start)
        payload["endTime"] = ts(start + timedelta(seconds=activity.elapsed_time))
    payload["elapsedDuration"] = duration(activity.elapsed_time)
    payload["movingDuration"] = duration(activity.moving_time)
    payload["timezone"] = TZ_PREFIX.sub("", activity.timezone).strip() or "UTC"
    payload["summary"] = _summary(activity)
    laps = [_lap(lap) for lap in activity.laps]
    if laps:
        payload["laps"] = laps
    if activity.commute:
        payload["isCommute"] = True
    if activity.workout_type and RACE_WORKOUT_TYPE.get(kind) == activity.workout_type:
        payload["isRace"] = True
    if kind == FALLBACK_TYPE and sport:
        payload["customSubtype"] = sport
    gear_id = activity.gear_id or activity.gear.id
    if gear_id:
        payload["gearExternalId"] = gear_id
        name = activity.gear.name or (gear.name if gear is not None else "")
        if name:
            payload["gearName"] = name
    return payload


def ingest_problems(payload: dict[str, Any]) -> list[str]:
    """Why core could never ingest this ``ActivitySourcePayload`` (empty when it can).

    Core's activity ingest (reference §2.7 step 5, §1.12) requires a non-zero
    ``start_time`` and ``elapsed_duration`` > 0; a result without them is
    NAKed until MaxDeliver and dead-lettered, never ingested. An unparseable
    or missing ``start_date`` leaves ``startTime`` out, an ``elapsed_time`` of
    0 (or less) gives ``"0s"``: both are unmappable data (contract §3 poison).
    """
    problems = []
    start = parse_time(str(payload.get("startTime", "")))
    if start is None or start <= EPOCH:
        problems.append("no start time")
    elapsed = str(payload.get("elapsedDuration", "0s")).removesuffix("s")
    try:
        positive = float(elapsed) > 0
    except ValueError:
        positive = False
    if not positive:
        problems.append("elapsed time not above zero")
    return problems


def _summary(a: StravaActivity) -> dict[str, Any]:
    s: dict[str, Any] = {}
    if a.distance > 0:
        s["distanceM"] = a.distance
    if a.total_elevation_gain > 0:
        s["elevationGainM"] = a.total_elevation_gain
    if a.average_speed > 0:
        s["avgSpeedMps"] = a.average_speed
    if a.max_speed > 0:
        s["maxSpeedMps"] = a.max_speed
    if a.has_heartrate and a.average_heartrate > 0:
        s["avgHeartRateBpm"] = int(a.average_heartrate)
    if a.has_heartrate and a.max_heartrate > 0:
        s["maxHeartRateBpm"] = int(a.max_heartrate)
    if a.average_watts > 0:
        s["avgPowerW"] = int(a.average_watts)
    if a.max_watts > 0:
        s["maxPowerW"] = int(a.max_watts)
    if a.weighted_average_watts > 0:
        s["normalizedPowerW"] = int(a.weighted_average_watts)
    if a.average_cadence > 0:
        s["avgCadence"] = int(a.average_cadence)
    if a.average_temp != 0:
        s["avgTemperatureC"] = a.average_temp
    if a.calories > 0:
        s["caloriesKcal"] = int(a.calories)
    elif a.kilojoules > 0:
        s["caloriesKcal"] = int(a.kilojoules)
    return s


def _lap(lap: StravaLap) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if lap.lap_index:
        out["index"] = lap.lap_index
    start = parse_time(lap.start_date)
    if start is not None:
        out["startTime"] = ts(start)
    out["elapsedDuration"] = duration(lap.elapsed_time)
    out["movingDuration"] = duration(lap.moving_time)
    for src, dst in (("distance", "distanceM"), ("average_speed", "avgSpeedMps"),
                     ("total_elevation_gain", "elevationGainM")):
        if getattr(lap, src) > 0:
            out[dst] = getattr(lap, src)
    for src, dst in (("average_heartrate", "avgHeartRateBpm"), ("max_heartrate", "maxHeartRateBpm"),
                     ("average_watts", "avgPowerW"), ("average_cadence", "avgCadence")):
        if getattr(lap, src) > 0:
            out[dst] = _round(getattr(lap, src))
    if lap.name:
        out["label"] = lap.name
    return out


def _data(streams: dict[str, Any], key: str) -> list[Any] | None:
    entry = streams.get(key)
    if isinstance(entry, dict) and isinstance(entry.get("data"), list):
        return entry["data"]
    return None


def _num(value: Any, as_int: bool) -> float | int | str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0 if as_int else STREAM_GAP
    return int(value) if as_int else float(value)


def map_streams(streams: dict[str, Any] | None) -> dict[str, Any] | None:
    """``cairn.v1.ActivityStream`` (protojson dict) from Strava's key_by_type map.

    None without a non-empty ``time`` channel (no stream at all, core keeps
    whatever it has). Stream hygiene (contract): timestamps made strictly increasing (a
    duplicate keeps the last sample, a backwards one is dropped); missing float samples are
    ``protos.STREAM_GAP`` (a bare NaN is refused by the strict parser), missing ints 0.
    """
    if not streams:
        return None
    times = _data(streams, "time")
    if not times:
        return None
    keep = _monotonic_indices(times)
    if not keep:
        return None
    n = len(keep)
    out: dict[str, Any] = {"sampleCount": n, "resolutionHz": STREAM_RESOLUTION_HZ}
    channels: list[str] = []
    columns: dict[str, list[Any]] = {"timeS": [float(times[i]) for i in keep]}
    latlng = _data(streams, "latlng")
    if latlng:
        pairs = [latlng[i] if i < len(latlng) and isinstance(latlng[i], list)
                 and len(latlng[i]) == 2 else [None, None] for i in keep]
        columns["latitude"] = [_num(p[0], False) for p in pairs]
        columns["longitude"] = [_num(p[1], False) for p in pairs]
        channels += ["STREAM_CHANNEL_LATITUDE", "STREAM_CHANNEL_LONGITUDE"]
    for key, column, channel, as_int in STREAM_COLUMNS:
        data = _data(streams, key)
        if not data:
            continue
        columns[column] = [_num(data[i] if i < len(data) else None, as_int) for i in keep]
        channels.append(f"STREAM_CHANNEL_{channel}")
    if channels:
        out["channels"] = channels
    out.update(columns)
    return out


def _monotonic_indices(times: list[Any]) -> list[int]:
    """Indices giving strictly increasing timestamps; a duplicate keeps its last sample."""
    keep: list[int] = []
    last: float | None = None
    for i, value in enumerate(times):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if last is None or value > last:
            keep.append(i)
            last = value
        elif value == last:
            keep[-1] = i
    return keep


def gear_kind(gear_id: str) -> str:
    """Strava prefixes bike ids with ``b`` and shoe ids with ``g``."""
    return "bike" if gear_id.startswith("b") else "shoes" if gear_id.startswith("g") else ""


def map_gear(gear: StravaGear) -> dict[str, Any]:
    """``GearImport`` as a protojson dict (display data; core resolves by external id)."""
    out: dict[str, Any] = {}
    if gear.name:
        out["name"] = gear.name
    if gear.brand_name:
        out["brand"] = gear.brand_name
    if gear.model_name:
        out["model"] = gear.model_name
    kind = gear_kind(gear.id)
    if kind:
        out["kind"] = kind
    if gear.description:
        out["description"] = gear.description
    if gear.distance > 0:
        out["distanceM"] = gear.distance
    if gear.retired:
        out["retired"] = True
    if gear.primary:
        out["primary"] = True
    return out
