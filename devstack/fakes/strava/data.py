"""Synthetic Strava data for the fake Strava API: activities, streams, laps, segments and gear.

Everything is generated deterministically from the athlete id and the
activity's index (a seeded ``random.Random``), so a test that names an athlete
and an anchor time gets the same activities on every run and every machine.
The shapes are Strava's ``DetailedActivity``, stream set, ``Lap``,
``DetailedSegment`` and ``DetailedGear`` (reference ``cairn.md`` §4): realistic
values, small bodies. The HTTP side (routes, faults) is ``devstack.fakes.strava.api``,
with budgets in ``limits`` and auth in ``oauth``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

ISO_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # Strava's timestamp form
STREAM_SAMPLES_MAX = 600  # samples per generated stream: realistic shape, small bodies
ACTIVITY_SPACING_S = 22 * 3600  # generated activities are ~a day apart, newest first
STREAM_KEYS = ("time", "latlng", "altitude", "distance", "velocity_smooth", "heartrate",
               "cadence", "watts", "temp", "grade_smooth", "moving")
# (sport_type, legacy type, speed m/s, distance range km, has gps, has power, gear kind)
SPORTS = (("Ride", "Ride", 8.0, (25, 70), True, True, "bike"),
          ("Run", "Run", 3.1, (5, 15), True, False, "shoe"),
          ("GravelRide", "Ride", 6.5, (30, 80), True, True, "bike"),
          ("TrailRun", "Run", 2.6, (8, 20), True, False, "shoe"),
          ("Swim", "Swim", 0.8, (1, 3), False, False, None),
          ("Hike", "Hike", 1.3, (8, 16), True, False, "shoe"),
          ("VirtualRide", "VirtualRide", 9.0, (20, 45), True, True, "bike"),
          ("Walk", "Walk", 1.4, (3, 7), True, False, "shoe"),
          ("WeightTraining", "WeightTraining", 0.0, (0, 0), False, False, None))
# What Strava's SummaryGear keeps of a gear record (athlete profile, activity detail).
GEAR_SUMMARY_KEYS = ("id", "primary", "name", "nickname", "retired", "distance", "converted_distance")


def iso_utc(ts: float) -> str:
    """Strava's timestamp form, ``2026-01-01T00:00:00Z``."""
    return datetime.fromtimestamp(ts, UTC).strftime(ISO_FORMAT)


def start_ts(activity: dict[str, Any]) -> float:
    """An activity's ``start_date`` as unix seconds; 0 when it is missing or not Strava's form
    (a patched broken activity still lists, as the oldest)."""
    try:
        return datetime.strptime(str(activity.get("start_date") or ""), ISO_FORMAT).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0


def encode_polyline(points: list[list[float]], precision: int = 5) -> str:
    """Google encoded polyline (what Strava's ``map.polyline`` carries)."""
    factor, out, prev = 10 ** precision, [], (0, 0)
    for lat, lon in points:
        cur = (round(lat * factor), round(lon * factor))
        for delta in (cur[0] - prev[0], cur[1] - prev[1]):
            value = ~(delta << 1) if delta < 0 else delta << 1
            while value >= 0x20:
                out.append(chr((0x20 | (value & 0x1F)) + 63))
                value >>= 5
            out.append(chr(value + 63))
        prev = cur
    return "".join(out)


@dataclass
class FakeAthlete:
    """One athlete: its current token pair for one app and its generated data."""

    athlete_id: int
    client_id: str
    access_token: str
    refresh_token: str
    expires_at: int
    activities: dict[int, dict[str, Any]] = field(default_factory=dict)  # id -> DetailedActivity
    streams: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    gear: dict[str, dict[str, Any]] = field(default_factory=dict)
    segments: dict[int, dict[str, Any]] = field(default_factory=dict)
    photos: dict[int, list[Any]] = field(default_factory=dict)  # activity id -> media.FakePhoto


def gear_summary(gear: dict[str, Any]) -> dict[str, Any]:
    """A ``DetailedGear`` record cut down to the ``SummaryGear`` Strava embeds elsewhere."""
    return {k: gear[k] for k in GEAR_SUMMARY_KEYS} | {"resource_state": 2}


def generate_gear(athlete_id: int) -> dict[str, dict[str, Any]]:
    """Two bikes (``b…``) and two pairs of shoes (``g…``): the first of each primary, the second retired."""
    gear: dict[str, dict[str, Any]] = {}
    for idx, (kind, retired) in enumerate((("b", False), ("b", True), ("g", False), ("g", True))):
        gid = f"{kind}{athlete_id * 10 + idx}"
        bike = kind == "b"
        gear[gid] = {
            "id": gid, "primary": idx in (0, 2), "name": f"{'Bike' if bike else 'Shoe'} {idx}",
            "nickname": f"{'Bike' if bike else 'Shoe'} {idx}", "resource_state": 3,
            "retired": retired, "distance": 0.0, "converted_distance": 0.0,
            "brand_name": "Canyon" if bike else "Hoka", "model_name": f"Model {idx}",
            "frame_type": 3 if bike else None, "description": "", "weight": 8.2 if bike else None}
    return gear


def generate_activity(ath: FakeAthlete, i: int, start: float) -> dict[str, Any]:
    """The athlete's ``i``-th activity starting at ``start``, stored on ``ath`` with its streams.

    The sport rotates through ``SPORTS``; gear of the matching kind (if the athlete
    has any) accumulates the distance; rides and runs with GPS get one segment effort.
    """
    rng = random.Random(f"{ath.athlete_id}:{i}")
    sport, legacy, speed, (dmin, dmax), gps, power, gear_kind = SPORTS[i % len(SPORTS)]
    aid = ath.athlete_id * 100_000 + i + 1
    start = float(int(start))
    distance = round(rng.uniform(dmin, dmax) * 1000, 1) if speed else 0.0
    moving = int(distance / speed) if speed else rng.randint(2400, 4200)
    elapsed = moving + rng.randint(0, 600)
    n = min(elapsed + 1, STREAM_SAMPLES_MAX)
    times = [round(k * elapsed / (n - 1)) for k in range(n)]
    lat0, lon0 = 47.3 + (ath.athlete_id % 50) * 0.01, 8.5 + (i % 20) * 0.01
    radius = max(distance, 1000.0) / (2 * math.pi) / 111_000
    latlng = [[round(lat0 + radius * math.sin(2 * math.pi * k / n), 6),
               round(lon0 + radius * (1 - math.cos(2 * math.pi * k / n)), 6)] for k in range(n)]
    altitude = [round(420 + 60 * math.sin(k / 40) + rng.random(), 1) for k in range(n)]
    hr = [int(120 + 30 * math.sin(k / 60) + rng.randint(0, 8)) for k in range(n)]
    streams: dict[str, list[Any]] = {
        "time": times, "distance": [round(distance * t / elapsed, 1) for t in times],
        "velocity_smooth": [round(max(speed + rng.uniform(-0.5, 0.5), 0), 2) if speed else 0.0
                            for _ in range(n)],
        "heartrate": hr, "moving": [True] * n, "temp": [18 + (k * 4) // n for k in range(n)],
        "cadence": [rng.randint(80, 95) if legacy != "Run" else rng.randint(84, 90) for _ in range(n)]}
    if gps:
        streams.update(latlng=latlng, altitude=altitude,
                       grade_smooth=[round(rng.uniform(-4, 4), 1) for _ in range(n)])
    if power:
        streams["watts"] = [rng.randint(140, 260) for _ in range(n)]
    gear_ids = [g for g, rec in ath.gear.items() if g[0] == ("b" if gear_kind == "bike" else "g")]
    gear_id = gear_ids[i % len(gear_ids)] if gear_kind and gear_ids else None
    avg_w = round(sum(streams["watts"]) / n, 1) if power else None
    act: dict[str, Any] = {
        "resource_state": 3, "athlete": {"id": ath.athlete_id, "resource_state": 1},
        "name": f"{sport} #{i + 1}", "distance": distance, "moving_time": moving,
        "elapsed_time": elapsed, "total_elevation_gain": round(rng.uniform(20, 900), 1) if gps else 0,
        "type": legacy, "sport_type": sport, "workout_type": None, "id": aid,
        "start_date": iso_utc(start), "start_date_local": iso_utc(start + 3600),
        "timezone": "(GMT+01:00) Europe/Zurich", "utc_offset": 3600.0,
        "location_city": None, "location_state": None, "location_country": "Switzerland",
        "achievement_count": 0, "kudos_count": rng.randint(0, 20), "comment_count": 0,
        "athlete_count": 1, "photo_count": 0,
        "map": {"id": f"a{aid}", "polyline": encode_polyline(latlng) if gps else None,
                "summary_polyline": encode_polyline(latlng[::10]) if gps else None, "resource_state": 3},
        "trainer": sport == "VirtualRide", "commute": i % 7 == 3, "manual": False, "private": False,
        "visibility": "everyone", "flagged": False, "gear_id": gear_id,
        "start_latlng": latlng[0] if gps else [], "end_latlng": latlng[-1] if gps else [],
        "average_speed": round(distance / moving, 3) if distance else 0.0,
        "max_speed": round(max(streams["velocity_smooth"]), 3),
        "average_cadence": round(sum(streams["cadence"]) / n, 1), "average_temp": 19,
        "has_heartrate": True, "average_heartrate": round(sum(hr) / n, 1), "max_heartrate": float(max(hr)),
        "heartrate_opt_out": False, "display_hide_heartrate_option": True,
        "elev_high": max(altitude) if gps else None, "elev_low": min(altitude) if gps else None,
        "upload_id": aid * 10, "external_id": f"garmin_ping_{aid}.fit", "from_accepted_tag": False,
        "pr_count": 0, "total_photo_count": 0, "has_kudoed": False,
        "description": f"Generated activity {i + 1}", "calories": round(moving * 0.2, 1),
        "device_name": "Garmin Edge 840" if legacy == "Ride" else "Garmin Forerunner 965",
        "embed_token": f"{rng.getrandbits(64):016x}", "photos": {"primary": None, "count": 0},
        "segment_efforts": [], "laps": [], "available_zones": [],
    }
    if avg_w is not None:  # power
        act.update(average_watts=avg_w, weighted_average_watts=int(avg_w * 1.05),
                   max_watts=max(streams["watts"]), kilojoules=round(avg_w * moving / 1000, 1),
                   device_watts=True)
    if gear_id:
        g = ath.gear[gear_id]
        g["distance"] = round(g["distance"] + distance, 1)
        g["converted_distance"] = round(g["distance"] / 1000, 1)
        act["gear"] = gear_summary(g)
    n_laps = max(1, min(6, int(distance // 10_000)))
    for lap in range(n_laps):
        lo, hi = lap * n // n_laps, (lap + 1) * n // n_laps - 1
        lap_elapsed = max(times[hi] - times[lo], 1)
        act["laps"].append({
            "id": aid * 100 + lap, "resource_state": 2, "name": f"Lap {lap + 1}",
            "activity": {"id": aid, "resource_state": 1}, "athlete": {"id": ath.athlete_id, "resource_state": 1},
            "elapsed_time": lap_elapsed, "moving_time": lap_elapsed, "start_date": iso_utc(start + times[lo]),
            "start_date_local": iso_utc(start + times[lo] + 3600), "distance": round(distance / n_laps, 1),
            "start_index": lo, "end_index": hi, "total_elevation_gain": round(rng.uniform(0, 100), 1),
            "average_speed": round(distance / n_laps / lap_elapsed, 3), "max_speed": act["max_speed"],
            "average_cadence": act["average_cadence"], "average_heartrate": act["average_heartrate"],
            "max_heartrate": act["max_heartrate"], "average_watts": avg_w, "lap_index": lap + 1,
            "split": lap + 1})
    if gps and legacy in ("Ride", "Run"):
        seg_id = 900_000 + (ath.athlete_id % 1000) * 10 + (i % 3)
        lo, hi = n // 4, n // 2
        seg = {"id": seg_id, "resource_state": 3, "name": f"Climb {i % 3}", "activity_type": legacy,
               "distance": round(distance / 4, 1), "average_grade": 4.2, "maximum_grade": 9.1,
               "elevation_high": max(altitude[lo:hi]), "elevation_low": min(altitude[lo:hi]),
               "climb_category": i % 3, "starred": False, "total_elevation_gain": 80.0,
               "map": {"id": f"s{seg_id}", "polyline": encode_polyline(latlng[lo:hi]), "resource_state": 3}}
        ath.segments[seg_id] = seg
        act["segment_efforts"].append({
            "id": aid * 1000 + 1, "resource_state": 2, "name": seg["name"],
            "activity": {"id": aid, "resource_state": 1}, "athlete": {"id": ath.athlete_id, "resource_state": 1},
            "elapsed_time": times[hi] - times[lo], "moving_time": times[hi] - times[lo],
            "start_date": iso_utc(start + times[lo]), "start_date_local": iso_utc(start + times[lo] + 3600),
            "distance": seg["distance"], "start_index": lo, "end_index": hi,
            "average_heartrate": act["average_heartrate"], "max_heartrate": act["max_heartrate"],
            "average_cadence": act["average_cadence"], "average_watts": avg_w,
            "segment": {k: v for k, v in seg.items() if k not in ("map", "total_elevation_gain")}})
    ath.activities[aid] = act
    ath.streams[aid] = {k: {"data": v, "series_type": "distance", "original_size": n,
                            "resolution": "high"} for k, v in streams.items()}
    return act


def blank_samples(ath: FakeAthlete, activity_id: int, keys: Sequence[str], indices: range) -> None:
    """Turn samples of an activity's streams into ``null`` (a GPS or sensor dropout): a gap in the
    recording, which the pool must carry as a gap (float columns) without failing the import."""
    streams = ath.streams[activity_id]
    for key in keys:
        for i in indices:
            streams[key]["data"][i] = None
