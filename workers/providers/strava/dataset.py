"""The raw archive ("dataset 1") and the one parser that reads it.

Why the import parses its own archive: contract §1 requires that a re-parse
reproduces the import. The surest way is that there is only one path from raw
inputs to events: ``fetch_source`` builds the archive bytes, then runs
``parse_archive`` on *those bytes*, exactly as ``parse_blob`` later does on
the downloaded blob. Byte-identical output follows by construction (float
repr, key order and nulls go through the same JSON round trip).

Envelope (compatible with the published Go worker's dataset 1)::

    {"version": 1,
     "provenance": {"provider", "worker_name", "worker_version", "package", "archived_at"},
     "activity": {…Strava DetailedActivity…},
     "streams": {…key_by_type map…},          # omitted when the activity has none
     "gear": [{…Strava DetailedGear…}],       # additive: omitted when no lookup succeeded
     "segments": [{…Strava DetailedSegment…}],  # additive: the details the efforts used
     "photos": [{"source", "photo": {…Strava photo…},
                 "mirror": {"blob_id", "content_type", "size", "url"}}]}  # additive

We archive Strava's full activity JSON (the Go worker kept only its decoded
subset); both read the same, and the full object lets a later parser revision
use a new field without a re-fetch. ``gear`` is additive to dataset 1:
archives without it parse with gear id/name from the activity and no GEAR event.
``segments`` and ``photos`` are additive too (parser 1.1): the segment events
and the activity's attachments come from them alone, and an archive without
them yields no segment events and no attachments.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from functools import partial
from typing import Any

from pydantic import ValidationError

from workers.providers import protos
from workers.providers.errors import ProviderPermanentError, ProviderTransientError, archive_dataset
from workers.providers.strava.mapping import ingest_problems, map_activity, map_gear, map_streams, ts
from workers.providers.strava.models import StravaActivity, StravaGear
from workers.providers.strava.photos import attachments
from workers.providers.strava.segments import segment_events

DATASET_VERSION = 1
PARSER_VERSION = "1.1"  # dataset 1, output revision 1 (segments, attachments); bump M on any output change
PROVIDER = "strava"
CONTENT_TYPE = "application/json"


class UnmappableActivity(ProviderPermanentError):
    """The activity lacks what core requires of an import (start time, positive duration).

    Permanent: the same input maps the same way on every retry, and core would
    NAK such a result up to MaxDeliver and dead-letter it (reference §2.7). The
    job gets a failure envelope ``unmappable`` and is termed (contract §3).
    """

    code = "unmappable"


def build_archive(activity: dict[str, Any], streams: dict[str, Any] | None,
                  gear: list[dict[str, Any]], *, segments: list[dict[str, Any]] | None = None,
                  photos: list[dict[str, Any]] | None = None, worker_name: str = "",
                  worker_version: str = "", package: str = "",
                  archived_at: datetime | None = None) -> bytes:
    """Serialize the raw inputs of one import as a dataset-1 envelope."""
    envelope: dict[str, Any] = {
        "version": DATASET_VERSION,
        "provenance": {"provider": PROVIDER, "worker_name": worker_name,
                       "worker_version": worker_version or PARSER_VERSION, "package": package,
                       "archived_at": ts(archived_at or datetime.now(UTC))},
        "activity": activity,
    }
    if streams:
        envelope["streams"] = streams
    if gear:
        envelope["gear"] = gear
    if segments:
        envelope["segments"] = segments
    if photos:
        envelope["photos"] = photos
    return json.dumps(envelope, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def read_archive(raw: bytes) -> dict[str, Any]:
    """Decode and check an archive; the dataset version decides whether we may read it."""
    try:
        envelope = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ProviderTransientError("archive is not JSON") from None
    if not isinstance(envelope, dict) or not isinstance(envelope.get("activity"), dict):
        raise ProviderTransientError("archive has no activity")
    archive_dataset(envelope.get("version", DATASET_VERSION), DATASET_VERSION)
    return envelope


@dataclasses.dataclass(frozen=True)
class ParsedArchive:
    """What one archive parses to: the activity result's events and the segment result's."""

    ext_id: str
    events: list[dict[str, Any]]  # GEAR events, then the ACTIVITY
    segment_events: list[dict[str, Any]]  # SEGMENT events, then SEGMENT_EFFORT events


def parse_archive(raw: bytes, *, user_id: str, account_id: str,
                  ext_id: str = "") -> tuple[str, list[dict[str, Any]]]:
    """``(ext_id, events)``: GEAR events then the ACTIVITY, as protojson ``WorkerEvent`` dicts."""
    parsed = parse_dataset(raw, user_id=user_id, account_id=account_id, ext_id=ext_id)
    return parsed.ext_id, parsed.events


def parse_dataset(raw: bytes, *, user_id: str, account_id: str, ext_id: str = "") -> ParsedArchive:
    """Every event one archive yields; the only path from raw inputs to events."""
    envelope = read_archive(raw)
    try:
        activity = StravaActivity.model_validate(envelope["activity"])
        gears = [StravaGear.model_validate(g) for g in envelope.get("gear") or []
                 if isinstance(g, dict)]
    except ValidationError as exc:
        raise ProviderPermanentError(f"unmappable activity: {exc.error_count()} field errors",
                                     code="unmappable") from None
    ext_id = ext_id or (str(activity.id) if activity.id else "")
    if not ext_id:
        raise ProviderPermanentError("archive names no activity id", code="missing_ext_id")

    ref = partial(protos.ref, PROVIDER, user_id, account_id)

    events: list[dict[str, Any]] = []
    gear_id = activity.gear_id or activity.gear.id
    by_id = {g.id: g for g in gears if g.id}
    for gear in by_id.values():
        events.append({"type": "WORKER_EVENT_TYPE_GEAR",
                       "gear": {"ref": ref(gear.id), "payload": map_gear(gear)}})
    payload = map_activity(activity, by_id.get(gear_id))
    problems = ingest_problems(payload)
    if problems:
        raise UnmappableActivity(f"activity {ext_id} is unmappable: {', '.join(problems)}")
    imported: dict[str, Any] = {"ref": ref(ext_id), "payload": payload}
    streams = envelope.get("streams")
    stream = map_streams(streams if isinstance(streams, dict) else None)
    if stream is not None:
        imported["stream"] = stream
    photos = envelope.get("photos")
    mirrored = attachments(photos if isinstance(photos, list) else [])
    if mirrored:
        imported["attachments"] = mirrored
    events.append({"type": "WORKER_EVENT_TYPE_ACTIVITY", "activity": imported})
    segments = envelope.get("segments")
    segment_result = segment_events(envelope["activity"], segments if isinstance(segments, list) else [],
                                    ext_id, ref)
    return ParsedArchive(ext_id, events, segment_result)
