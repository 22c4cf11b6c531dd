"""A decoded Garmin FIT activity (+ Connect's summary and gear) → Cairn protojson shapes."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from workers.providers.protos import STREAM_GAP, activity_type_fields

SEMICIRCLE_DEG = 180.0 / 2**31
STREAM_RESOLUTION_HZ = 1.0
FIT_EPOCH_UNIX = 631065600  # 1989-12-31T00:00:00Z: FIT's local_timestamp counts from here
SECONDS_PER_HOUR = 3600
FALLBACK_TYPE = "WORKOUT"
RACE_EVENT_TYPE = "race"
EXTRA_DEVICE = "device"
EXTRA_SOFTWARE = "device_software"
# FIT sport → (ActivityType, default Discipline or "", e-bike)
SPORTS: dict[str, tuple[str, str, bool]] = {
    "running": ("RUN", "RUN_ROAD", False), "cycling": ("RIDE", "RIDE_ROAD", False),
    "e_biking": ("RIDE", "RIDE_ROAD", True), "swimming": ("SWIM", "", False),
    "walking": ("WALK", "", False), "hiking": ("HIKE", "", False), "mountaineering": ("HIKE", "", False),
    "snowshoeing": ("HIKE", "", False), "rowing": ("ROW", "", False), "paddling": ("KAYAK", "", False),
    "kayaking": ("KAYAK", "", False), "rafting": ("KAYAK", "", False),
    "stand_up_paddleboarding": ("SUP", "", False), "surfing": ("SURF", "", False),
    "windsurfing": ("SURF", "", False), "kitesurfing": ("SURF", "", False),
    "alpine_skiing": ("SKI", "SKI_ALPINE", False), "cross_country_skiing": ("SKI", "SKI_NORDIC", False),
    "snowboarding": ("SNOWBOARD", "", False), "inline_skating": ("SKATE", "", False),
    "ice_skating": ("SKATE", "", False), "golf": ("GOLF", "", False), "rock_climbing": ("CLIMB", "", False),
    "tennis": ("TENNIS", "", False), "racket": ("TENNIS", "", False), "pickleball": ("TENNIS", "", False),
    "padel": ("TENNIS", "", False), "wheelchair_push_run": ("WHEELCHAIR", "", False),
    "wheelchair_push_walk": ("WHEELCHAIR", "", False),
}
# (ActivityType, FIT sub-sport) → Discipline; sub-sports mean different things per sport ("track").
DISCIPLINES: dict[tuple[str, str], str] = {
    ("RUN", "trail"): "RUN_TRAIL", ("RUN", "track"): "RUN_TRACK", ("RUN", "street"): "RUN_ROAD",
    ("RIDE", "road"): "RIDE_ROAD", ("RIDE", "mountain"): "RIDE_MTB", ("RIDE", "downhill"): "RIDE_MTB",
    ("RIDE", "e_bike_mountain"): "RIDE_MTB", ("RIDE", "gravel_cycling"): "RIDE_GRAVEL",
    ("RIDE", "cyclocross"): "RIDE_CYCLOCROSS", ("RIDE", "track_cycling"): "RIDE_TRACK",
    ("RIDE", "bmx"): "RIDE_BMX", ("SWIM", "lap_swimming"): "SWIM_POOL",
    ("SWIM", "open_water"): "SWIM_OPEN_WATER", ("SKI", "backcountry"): "SKI_BACKCOUNTRY",
    ("SKI", "resort"): "SKI_ALPINE", ("SKI", "skate_skiing"): "SKI_NORDIC",
}
SUB_SPORT_TYPES = {"elliptical": "ELLIPTICAL", "indoor_rowing": "ROW"}  # sub-sports that are their own type
EBIKE_SUB_SPORTS = frozenset({"e_bike_fitness", "e_bike_mountain"})
VIRTUAL_SUB_SPORTS = frozenset({"virtual_activity"})
GEAR_KINDS = {"shoes": "shoes", "bike": "bike"}
RETIRED_STATUS = "retired"
# record field → (ActivityStream column, StreamChannel, is_int); enhanced fields win (wider range)
RECORD_COLUMNS: tuple[tuple[tuple[str, ...], str, str, bool], ...] = (
    (("enhanced_altitude", "altitude"), "altitudeM", "ALTITUDE", False),
    (("distance",), "distanceM", "DISTANCE", False),
    (("enhanced_speed", "speed"), "speedMps", "SPEED", False),
    (("heart_rate",), "heartRateBpm", "HEART_RATE", True),
    (("power",), "powerW", "POWER", True),
    (("cadence",), "cadence", "CADENCE", True),
    (("temperature",), "temperatureC", "TEMPERATURE", False),
)


def classify_sport(sport: str, sub_sport: str) -> tuple[str, str, bool, bool]:
    """(ActivityType, Discipline, e-bike, virtual) for a FIT sport and sub-sport; unknown → WORKOUT."""
    kind, discipline, ebike = SPORTS.get(sport, (FALLBACK_TYPE, "", False))
    if sub_sport in SUB_SPORT_TYPES:
        kind, discipline = SUB_SPORT_TYPES[sub_sport], ""
    discipline = DISCIPLINES.get((kind, sub_sport), discipline)
    return kind, discipline, ebike or sub_sport in EBIKE_SUB_SPORTS, sub_sport in VIRTUAL_SUB_SPORTS


def ts(value: datetime) -> str:
    """protojson Timestamp: RFC 3339 UTC with ``Z`` (millisecond FIT times keep their fraction)."""
    value = value.astimezone(UTC)
    text = value.strftime("%Y-%m-%dT%H:%M:%S")
    return text + (f".{value.microsecond:06d}".rstrip("0") if value.microsecond else "") + "Z"


def duration(seconds: float) -> str:
    """protojson Duration: decimal seconds with an ``s`` suffix (FIT times are milliseconds)."""
    text = f"{seconds:.3f}".rstrip("0").rstrip(".")
    return f"{text or '0'}s"


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _first(message: dict[str, Any], names: Iterable[str]) -> float | None:
    for name in names:
        value = _num(message.get(name))
        if value is not None:
            return value
    return None


def _total(sessions: list[dict[str, Any]], *names: str) -> float | None:
    values = [v for v in (_first(s, names) for s in sessions) if v is not None]
    return sum(values) if values else None


def _extreme(sessions: list[dict[str, Any]], pick: Any, *names: str) -> float | None:
    values = [v for v in (_first(s, names) for s in sessions) if v is not None]
    return pick(values) if values else None


def _set(out: dict[str, Any], key: str, value: float | None, *, as_int: bool = False,
         positive: bool = True) -> None:
    if value is None or (positive and value <= 0):
        return
    out[key] = int(value + 0.5) if as_int else value


def start_time(messages: dict[str, list[dict[str, Any]]]) -> datetime | None:
    sessions = messages.get("session_mesgs") or []
    starts: list[datetime] = [s["start_time"] for s in sessions if isinstance(s.get("start_time"), datetime)]
    return min(starts) if starts else None


def elapsed_s(messages: dict[str, list[dict[str, Any]]]) -> float:
    return _total(messages.get("session_mesgs") or [], "total_elapsed_time") or 0.0


def timezone_name(summary: dict[str, Any], messages: dict[str, list[dict[str, Any]]]) -> str:
    """Connect's IANA zone; else the FIT activity's UTC offset as ``Etc/GMT±H``; else UTC."""
    zone = (summary.get("timeZoneUnitDTO") or {}).get("timeZone")
    if isinstance(zone, str) and zone.strip():
        return zone.strip()
    for activity in messages.get("activity_mesgs") or []:
        local, stamp = activity.get("local_timestamp"), activity.get("timestamp")
        if isinstance(local, datetime):  # fitdecode reads the local wall clock as if it were UTC
            local = int(local.timestamp()) - FIT_EPOCH_UNIX
        if isinstance(local, int) and isinstance(stamp, datetime):
            offset = local + FIT_EPOCH_UNIX - int(stamp.timestamp())
            hours, rest = divmod(offset, SECONDS_PER_HOUR)
            if rest == 0 and hours:
                return f"Etc/GMT{'-' if hours > 0 else '+'}{abs(hours)}"  # POSIX signs are inverted
            if offset == 0:
                return "UTC"
    return "UTC"


def device_name(messages: dict[str, list[dict[str, Any]]]) -> str:
    """``<manufacturer> <product>`` of the recording device (FIT file_id), or ""."""
    for file_id in messages.get("file_id_mesgs") or []:
        maker = str(file_id.get("manufacturer") or "").strip()
        product = file_id.get("product_name") or file_id.get("garmin_product") or file_id.get("product")
        parts = [p for p in (maker, str(product).strip() if product not in (None, "") else "") if p]
        if parts:
            return " ".join(parts)
    return ""


def _software(messages: dict[str, list[dict[str, Any]]]) -> str:
    for info in messages.get("device_info_mesgs") or []:
        if info.get("device_index") in ("creator", 0) and _num(info.get("software_version")) is not None:
            return f"{float(info['software_version']):g}"
    return ""


def map_activity(messages: dict[str, list[dict[str, Any]]], summary: dict[str, Any],
                 gear: list[dict[str, Any]]) -> dict[str, Any]:
    """``cairn.v1.ActivitySourcePayload`` as a protojson dict.

    The FIT file is the measurement (sport, start, durations, totals, laps). Connect's summary adds what a
    device does not write: title, description, the IANA time zone (FIT knows only the UTC offset), the race
    event type and the activity type key. Several sessions (multisport) add up their totals and keep the
    first sport; ``moving`` is ``total_moving_time``, else the timer time (which excludes pauses). The device
    goes into ``extra``: the payload has no device field."""
    sessions = messages.get("session_mesgs") or []
    first = sessions[0] if sessions else {}
    sport, sub_sport = str(first.get("sport") or ""), str(first.get("sub_sport") or "")
    kind, discipline, ebike, virtual = classify_sport(sport, sub_sport)
    payload: dict[str, Any] = activity_type_fields(kind, discipline, ebike, virtual)
    type_key = str((summary.get("activityTypeDTO") or {}).get("typeKey") or "")
    native = type_key or "/".join(p for p in (sport, sub_sport) if p and p != "generic")
    if native:
        payload["providerNativeType"] = native
    for src, dst in (("activityName", "title"), ("description", "description")):
        if isinstance(summary.get(src), str) and summary[src]:
            payload[dst] = summary[src]
    start, elapsed = start_time(messages), elapsed_s(messages)
    if start is not None:
        payload["startTime"] = ts(start)
        payload["endTime"] = ts(start + timedelta(seconds=elapsed))
    payload["elapsedDuration"] = duration(elapsed)
    moving = _total(sessions, "total_moving_time", "total_timer_time")
    if moving is not None:
        payload["movingDuration"] = duration(moving)
    payload["timezone"] = timezone_name(summary, messages)
    payload["summary"] = _summary(sessions, messages.get("record_mesgs") or [])
    laps = [_lap(i, lap) for i, lap in enumerate(messages.get("lap_mesgs") or [], start=1)]
    if laps:
        payload["laps"] = laps
    extra = {k: v for k, v in ((EXTRA_DEVICE, device_name(messages)), (EXTRA_SOFTWARE, _software(messages))) if v}
    if extra:
        payload["extra"] = extra
    if (summary.get("eventType") or summary.get("eventTypeDTO") or {}).get("typeKey") == RACE_EVENT_TYPE:
        payload["isRace"] = True
    if kind == FALLBACK_TYPE and (type_key or sport):
        payload["customSubtype"] = type_key or sport
    used = next((g for g in gear if g.get("uuid")), None)
    if used is not None:
        payload["gearExternalId"] = str(used["uuid"])
        name = _gear_name(used)
        if name:
            payload["gearName"] = name
    return payload


def _summary(sessions: list[dict[str, Any]], records: list[dict[str, Any]]) -> dict[str, Any]:
    s: dict[str, Any] = {}
    _set(s, "distanceM", _total(sessions, "total_distance"))
    _set(s, "elevationGainM", _total(sessions, "total_ascent"))
    _set(s, "elevationLossM", _total(sessions, "total_descent"))
    altitudes = [v for v in (_first(r, ("enhanced_altitude", "altitude")) for r in records) if v is not None]
    low = _extreme(sessions, min, "enhanced_min_altitude", "min_altitude")
    high = _extreme(sessions, max, "enhanced_max_altitude", "max_altitude")
    _set(s, "minElevationM", low if low is not None else (min(altitudes) if altitudes else None), positive=False)
    _set(s, "maxElevationM", high if high is not None else (max(altitudes) if altitudes else None), positive=False)
    first = sessions[0] if len(sessions) == 1 else {}  # averages of several sessions do not add up
    _set(s, "avgSpeedMps", _first(first, ("enhanced_avg_speed", "avg_speed")))
    _set(s, "maxSpeedMps", _extreme(sessions, max, "enhanced_max_speed", "max_speed"))
    _set(s, "avgHeartRateBpm", _first(first, ("avg_heart_rate",)), as_int=True)
    _set(s, "maxHeartRateBpm", _extreme(sessions, max, "max_heart_rate"), as_int=True)
    _set(s, "avgPowerW", _first(first, ("avg_power",)), as_int=True)
    _set(s, "maxPowerW", _extreme(sessions, max, "max_power"), as_int=True)
    _set(s, "normalizedPowerW", _first(first, ("normalized_power",)), as_int=True)
    _set(s, "avgCadence", _first(first, ("avg_cadence",)), as_int=True)
    _set(s, "maxCadence", _extreme(sessions, max, "max_cadence"), as_int=True)
    _set(s, "avgTemperatureC", _first(first, ("avg_temperature",)), positive=False)
    _set(s, "minTemperatureC", _extreme(sessions, min, "min_temperature"), positive=False)
    _set(s, "maxTemperatureC", _extreme(sessions, max, "max_temperature"), positive=False)
    _set(s, "caloriesKcal", _total(sessions, "total_calories"), as_int=True)
    _set(s, "tss", _first(first, ("training_stress_score",)))
    _set(s, "intensityFactor", _first(first, ("intensity_factor",)))
    _set(s, "poolLengthM", _first(first, ("pool_length",)), as_int=True)
    _set(s, "totalStrokes", _total(sessions, "total_strokes"), as_int=True)
    return s


def _lap(index: int, lap: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"index": index}
    if isinstance(lap.get("start_time"), datetime):
        out["startTime"] = ts(lap["start_time"])
    out["elapsedDuration"] = duration(_first(lap, ("total_elapsed_time",)) or 0.0)
    moving = _first(lap, ("total_moving_time", "total_timer_time"))
    if moving is not None:
        out["movingDuration"] = duration(moving)
    _set(out, "distanceM", _first(lap, ("total_distance",)))
    _set(out, "avgHeartRateBpm", _first(lap, ("avg_heart_rate",)), as_int=True)
    _set(out, "maxHeartRateBpm", _first(lap, ("max_heart_rate",)), as_int=True)
    _set(out, "avgPowerW", _first(lap, ("avg_power",)), as_int=True)
    _set(out, "maxPowerW", _first(lap, ("max_power",)), as_int=True)
    _set(out, "avgSpeedMps", _first(lap, ("enhanced_avg_speed", "avg_speed")))
    _set(out, "avgCadence", _first(lap, ("avg_cadence",)), as_int=True)
    _set(out, "elevationGainM", _first(lap, ("total_ascent",)))
    return out


def map_stream(messages: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """``cairn.v1.ActivityStream`` (protojson dict) from the record messages; None without any.

    Sample times are made strictly increasing. A value a record lacks is ``STREAM_GAP`` (core's NaN gap marker)
    in a float column and 0 in an int column (dense); positions are semicircles, converted to degrees."""
    start = start_time(messages)
    records = [r for r in messages.get("record_mesgs") or [] if isinstance(r.get("timestamp"), datetime)]
    if start is None or not records:
        return None
    kept: list[dict[str, Any]] = []
    times: list[float] = []
    for record in records:
        offset = (record["timestamp"] - start).total_seconds()
        if times and offset == times[-1]:
            kept[-1] = record  # a duplicate timestamp keeps its last sample
        elif not times or offset > times[-1]:
            kept.append(record)
            times.append(offset)
    out: dict[str, Any] = {"sampleCount": len(kept), "resolutionHz": STREAM_RESOLUTION_HZ}
    channels: list[str] = []
    columns: dict[str, list[Any]] = {"timeS": times}
    if any(_num(r.get("position_lat")) is not None for r in kept):
        columns["latitude"] = [_degrees(r.get("position_lat")) for r in kept]
        columns["longitude"] = [_degrees(r.get("position_long")) for r in kept]
        channels += ["STREAM_CHANNEL_LATITUDE", "STREAM_CHANNEL_LONGITUDE"]
    for names, column, channel, as_int in RECORD_COLUMNS:
        values = [_first(r, names) for r in kept]
        if all(v is None for v in values):
            continue
        columns[column] = [(int(v) if v is not None else 0) if as_int else (v if v is not None else STREAM_GAP)
                           for v in values]
        channels.append(f"STREAM_CHANNEL_{channel}")
    if channels:
        out["channels"] = channels
    out.update(columns)
    return out


def _degrees(value: Any) -> float | str:
    number = _num(value)
    return number * SEMICIRCLE_DEG if number is not None else STREAM_GAP


def _gear_name(gear: dict[str, Any]) -> str:
    return str(gear.get("displayName") or gear.get("customMakeModel") or "").strip()


def map_gear(gear: dict[str, Any]) -> dict[str, Any]:
    """``GearImport`` (protojson dict) from one entry of Connect's gear list."""
    out: dict[str, Any] = {}
    name = _gear_name(gear)
    if name:
        out["name"] = name
    for src, dst in (("gearMakeName", "brand"), ("gearModelName", "model")):
        value = str(gear.get(src) or "").strip()
        if value and value.lower() not in ("other", "unknown"):
            out[dst] = value
    kind = GEAR_KINDS.get(str(gear.get("gearTypeName") or "").strip().lower())
    if kind:
        out["kind"] = kind
    if str(gear.get("gearStatusName") or "").lower() == RETIRED_STATUS:
        out["retired"] = True
    return out
