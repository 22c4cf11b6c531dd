"""The raw archive ("dataset 1") of a Garmin import and the one parser that reads it."""

from __future__ import annotations

import dataclasses
import io
import json
import zipfile
from datetime import UTC, datetime
from functools import partial
from typing import Any

from workers.providers import protos
from workers.providers.errors import ProviderPermanentError, archive_dataset
from workers.providers.garmin.fit import decode_fit
from workers.providers.garmin.mapping import elapsed_s, map_activity, map_gear, map_stream, start_time, ts

DATASET_VERSION = 1
PARSER_VERSION = "1.0"  # dataset 1, output revision 0; bump M on any output change
PROVIDER = "garmin"
CONTENT_TYPE = "application/zip"
ENVELOPE_ENTRY = "archive.json"
FIT_ENTRY = "activity.fit"
ENTRY_DATE_TIME = (1980, 1, 1, 0, 0, 0)  # zip's earliest time: the archive's bytes depend on its inputs only
MAX_ENVELOPE_BYTES = 8 * 1024 * 1024
MAX_FIT_BYTES = 64 * 1024 * 1024
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class CorruptArchive(ProviderPermanentError):
    code = "corrupt_archive"


class UnmappableActivity(ProviderPermanentError):
    """No start time or no positive duration: core could never ingest it (reference §2.7)."""

    code = "unmappable"


def build_archive(activity_id: str, summary: dict[str, Any], gear: list[dict[str, Any]], fit: bytes, *,
                  worker_name: str = "", worker_version: str = "", package: str = "",
                  archived_at: datetime | None = None) -> bytes:
    """The zip: ``archive.json`` (version, provenance, activity_id, Connect's summary and gear) and
    ``activity.fit``, the original FIT exactly as Garmin served it. Its bytes depend on its inputs only."""
    envelope = {"version": DATASET_VERSION,
                "provenance": {"provider": PROVIDER, "worker_name": worker_name,
                               "worker_version": worker_version or PARSER_VERSION, "package": package,
                               "archived_at": ts(archived_at or datetime.now(UTC))},
                "activity_id": activity_id, "summary": summary, "gear": gear}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, body in ((ENVELOPE_ENTRY, json.dumps(envelope, separators=(",", ":"), ensure_ascii=False,
                                                       allow_nan=False).encode()), (FIT_ENTRY, fit)):
            info = zipfile.ZipInfo(name, ENTRY_DATE_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, body)
    return buffer.getvalue()


def read_archive(raw: bytes) -> tuple[dict[str, Any], bytes]:
    """The envelope and the FIT bytes of an archive this parser may read.

    An unreadable zip is permanent (``CorruptArchive``); another dataset version is NAKed
    (``errors.UnsupportedDataset``) so a pool that reads it takes the job."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(raw))
        envelope = json.loads(_entry(archive, ENVELOPE_ENTRY, MAX_ENVELOPE_BYTES))
    except (zipfile.BadZipFile, KeyError, OSError, ValueError, EOFError):
        raise CorruptArchive("not a Garmin dataset archive") from None
    if not isinstance(envelope, dict):
        raise CorruptArchive("archive envelope is not an object")
    archive_dataset(envelope.get("version", DATASET_VERSION), DATASET_VERSION)
    try:
        fit = _entry(archive, FIT_ENTRY, MAX_FIT_BYTES)
    except (zipfile.BadZipFile, KeyError, OSError, ValueError, EOFError):
        raise CorruptArchive("archive holds no readable FIT file") from None
    return envelope, fit


def _entry(archive: zipfile.ZipFile, name: str, limit: int) -> bytes:
    info = archive.getinfo(name)
    if info.file_size > limit:
        raise ValueError(f"{name} too large")
    with archive.open(info) as member:
        data = member.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{name} too large")
    return data


@dataclasses.dataclass(frozen=True)
class ParsedArchive:
    ext_id: str
    events: list[dict[str, Any]]  # GEAR events, then the ACTIVITY


def parse_dataset(raw: bytes, *, user_id: str, account_id: str, ext_id: str = "") -> ParsedArchive:
    """Every event one archive yields; the only path from raw inputs to events.

    ``fetch_source`` parses the archive bytes it built, as ``parse_blob`` does a downloaded one, so a
    re-parse reproduces the import (contract §1)."""
    envelope, fit = read_archive(raw)
    messages = decode_fit(fit)
    summary: dict[str, Any] = envelope["summary"] if isinstance(envelope.get("summary"), dict) else {}
    gear = [g for g in envelope.get("gear") or [] if isinstance(g, dict)]
    ext_id = ext_id or str(envelope.get("activity_id") or summary.get("activityId") or "")
    if not ext_id:
        raise ProviderPermanentError("archive names no activity id", code="missing_ext_id")
    start = start_time(messages)
    if start is None or start <= EPOCH or elapsed_s(messages) <= 0:
        raise UnmappableActivity(f"activity {ext_id} has no start time or no positive duration")

    ref = partial(protos.ref, PROVIDER, user_id, account_id)

    events: list[dict[str, Any]] = []
    seen: set[str] = set()
    for item in gear:
        gear_id = str(item.get("uuid") or "")
        if gear_id and gear_id not in seen:
            seen.add(gear_id)
            events.append({"type": "WORKER_EVENT_TYPE_GEAR", "gear": {"ref": ref(gear_id), "payload": map_gear(item)}})
    imported: dict[str, Any] = {"ref": ref(ext_id), "payload": map_activity(messages, summary, gear)}
    stream = map_stream(messages)
    if stream is not None:
        imported["stream"] = stream
    events.append({"type": "WORKER_EVENT_TYPE_ACTIVITY", "activity": imported})
    return ParsedArchive(ext_id, events)
