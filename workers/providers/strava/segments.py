"""Segments and segment efforts (reference §3.6 step 9, §4.6): fetch, cache, map."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from workers.providers.errors import ProviderError, ProviderRateLimited
from workers.providers.strava.cache import BoundedCache
from workers.providers.strava.client import StravaClient
from workers.providers.strava.mapping import duration, parse_time, ts
from workers.providers.strava.models import StravaSegment, StravaSegmentEffort

log = logging.getLogger(__name__)

SEGMENT_CACHE_MAX_ENTRIES = 4096  # ~2 KB per detail (polyline included): a few MB per process
SEGMENT_CACHE_TTL_S = 6 * 3600.0  # renamed segments / new stars show within this
# Strava climb_category 0..5 → cairn.v1.ClimbCategory (reference §4.6); anything else → NONE.
CLIMB_CATEGORIES = {0: "NONE", 1: "FOUR", 2: "THREE", 3: "TWO", 4: "ONE", 5: "HORS_CATEGORIE"}


class SegmentCache(BoundedCache):
    """Segment details by (account id, segment id), with this module's bounds as defaults.

    Athletes ride the same segments again and again and each detail spends the short window;
    keyed by account because a detail is read as the athlete (``starred``, private segments).
    """

    def __init__(self, max_entries: int = SEGMENT_CACHE_MAX_ENTRIES, ttl_s: float = SEGMENT_CACHE_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(max_entries, ttl_s, clock)


@dataclasses.dataclass
class SegmentFetch:
    """The details the activity's efforts need, in first-effort order, and what went wrong."""

    details: list[dict[str, Any]]
    errors: int = 0
    rate_limited: ProviderRateLimited | None = None


def _efforts(activity: Mapping[str, Any]) -> list[tuple[StravaSegmentEffort, dict[str, Any]]]:
    """The activity's efforts (model, raw ``segment`` summary) that name an effort and a segment
    id; a malformed entry is skipped, never the activity."""
    out = []
    for raw in activity.get("segment_efforts") or []:
        if not isinstance(raw, dict):
            continue
        try:
            effort = StravaSegmentEffort.model_validate(raw)
        except ValidationError:
            continue
        if effort.id and effort.segment.id:
            summary = raw.get("segment")
            out.append((effort, summary if isinstance(summary, dict) else {}))
    return out


def segment_ids(activity: Mapping[str, Any]) -> list[str]:
    """Distinct segment ids of the activity's efforts, in first-appearance order."""
    return list(dict.fromkeys(str(e.segment.id) for e, _ in _efforts(activity)))


def fetch_segments(client: StravaClient, activity: Mapping[str, Any], cache: SegmentCache,
                   account_id: str) -> SegmentFetch:
    """Each distinct segment's detail, from the cache or the API (every call reserves budget).

    A rate limit (budget denied or HTTP 429) stops the loop and is returned;
    any other failure skips that segment (and its efforts). The activity is already fetched:
    the caller publishes what it has and NAKs until the window resets, and the re-run finds
    the finished details in the cache.
    """
    result = SegmentFetch(details=[])
    for segment_id in segment_ids(activity):
        key = (account_id, segment_id)
        detail = cache.get(key)
        if detail is None:
            try:
                detail = client.get_segment(segment_id)
            except ProviderRateLimited as exc:
                result.rate_limited = exc
                break
            except ProviderError as exc:
                result.errors += 1
                log.warning("strava segment %s lookup skipped: %s", segment_id, type(exc).__name__)
                continue
            cache.put(key, detail)
        result.details.append(detail)
    return result


def _round(value: float) -> int:
    return int(value + 0.5)


def map_segment(segment: StravaSegment) -> dict[str, Any] | None:
    """``SegmentImport`` (protojson dict); None without a polyline (core cannot match it)."""
    if not segment.map.polyline:
        return None
    out: dict[str, Any] = {}
    if segment.name:
        out["name"] = segment.name
    out["activityType"] = ("ACTIVITY_TYPE_RUN" if segment.activity_type.lower() == "run"
                           else "ACTIVITY_TYPE_RIDE")
    out["encodedPolyline"] = segment.map.polyline
    if segment.distance > 0:
        out["distanceM"] = segment.distance
    for src, dst in (("total_elevation_gain", "elevationGainM"), ("average_grade", "avgGrade"),
                     ("maximum_grade", "maxGrade")):
        if getattr(segment, src) != 0:
            out[dst] = getattr(segment, src)
    out["climbCategory"] = f"CLIMB_CATEGORY_{CLIMB_CATEGORIES.get(segment.climb_category, 'NONE')}"
    if segment.starred:
        out["starred"] = True
    return out


def map_effort(effort: StravaSegmentEffort) -> dict[str, Any]:
    """``SegmentEffortImport`` (protojson dict): averages rounded and absent when 0 (§4.6)."""
    out: dict[str, Any] = {}
    start = parse_time(effort.start_date)
    if start is not None:
        out["startTime"] = ts(start)
    out["elapsed"] = duration(effort.elapsed_time)
    out["moving"] = duration(effort.moving_time)
    if effort.start_index:
        out["startOffset"] = effort.start_index
    if effort.end_index:
        out["endOffset"] = effort.end_index
    for src, dst in (("average_heartrate", "avgHeartRateBpm"), ("max_heartrate", "maxHeartRateBpm"),
                     ("average_watts", "avgPowerW"), ("average_cadence", "avgCadence")):
        if getattr(effort, src) > 0:
            out[dst] = _round(getattr(effort, src))
    return out


def _segment_payload(summary: dict[str, Any], detail: dict[str, Any] | None) -> dict[str, Any] | None:
    """The detail over the effort's summary; None when not fetched, malformed or without polyline."""
    if detail is None:
        return None
    try:
        return map_segment(StravaSegment.model_validate({**summary, **detail}))
    except ValidationError:
        return None


def segment_events(activity: Mapping[str, Any], details: Sequence[Any], ext_id: str,
                   ref: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
    """SEGMENT events (one per distinct segment) then SEGMENT_EFFORT events (one per effort).

    Built from the archive alone: ``details`` are the archived DetailedSegments, so
    ``parse_blob`` reproduces them byte for byte (contract §1); an archive without them yields none.
    An effort whose segment has no archived detail or no polyline is skipped
    with it (core could not resolve the effort's segment).
    """
    by_id: dict[str, dict[str, Any]] = {}
    for raw in details:
        if isinstance(raw, dict) and raw.get("id"):
            by_id.setdefault(str(raw["id"]), raw)
    payloads: dict[str, dict[str, Any] | None] = {}
    segments: list[dict[str, Any]] = []
    efforts: list[dict[str, Any]] = []
    seen_efforts: set[str] = set()
    for effort, summary in _efforts(activity):
        segment_id, effort_id = str(effort.segment.id), str(effort.id)
        if segment_id not in payloads:
            payloads[segment_id] = _segment_payload(summary, by_id.get(segment_id))
            if payloads[segment_id] is not None:
                segments.append({"type": "WORKER_EVENT_TYPE_SEGMENT",
                                 "segment": {"ref": ref(segment_id), "payload": payloads[segment_id]}})
        if payloads[segment_id] is None or effort_id in seen_efforts:
            continue
        seen_efforts.add(effort_id)
        efforts.append({"type": "WORKER_EVENT_TYPE_SEGMENT_EFFORT",
                        "segmentEffort": {"ref": ref(effort_id), "activityExternalId": ext_id,
                                          "segmentExternalId": segment_id, "payload": map_effort(effort)}})
    return segments + efforts
