"""Body validation for progress and result, in the real server's exact order (reference §1.9, §1.10).

Also the JavaScript value semantics the whole dev server shares (``.length``,
``slice``, truthiness, ``Date.toJSON()``), so ``app`` (the Worker API) and
``admin`` (the dev endpoints) both import them from here and not from each other.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any

from bson import ObjectId

MAX_TEXT = 100_000
MAX_PARTS = 5000
MAX_ERROR_UNITS = 2000  # a failure's lastError is cut at this many UTF-16 code units
_HEX24 = re.compile(r"^[0-9a-fA-F]{24}$")


class ApiError(Exception):
    def __init__(self, status: int, code: str) -> None:
        super().__init__(code)
        self.status, self.code = status, code


def iso(value: Any) -> Any:
    """``Date.toJSON()``: ISO-8601 UTC with milliseconds."""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
    return value


def js_len(s: str) -> int:
    """JavaScript ``.length``: UTF-16 code units."""
    return len(s.encode("utf-16-le")) // 2


def js_slice(s: str, units: int) -> str:
    """JavaScript ``s.slice(0, units)``: cut at ``units`` UTF-16 code units (may split a pair)."""
    if js_len(s) <= units:
        return s
    return s.encode("utf-16-le")[: units * 2].decode("utf-16-le", errors="ignore")


def js_truthy(value: Any) -> bool:
    """JavaScript ``Boolean(value)``: ``{}``, ``[]`` and ``"false"`` are true; ``0``, ``""``, null false."""
    if isinstance(value, (dict, list)):
        return True
    if isinstance(value, float) and math.isnan(value):
        return False
    return bool(value)


def object_id(raw: str) -> ObjectId:
    """bson 4.x ``isValid``: 24 hex characters, or any 12-byte string."""
    if _HEX24.match(raw):
        return ObjectId(raw)
    if len(raw) == 12 and len(raw.encode()) == 12:
        return ObjectId(raw.encode())
    raise ApiError(400, "invalid_job_id")


def _parts(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    if "parts" not in body:
        return None
    parts = body["parts"]
    if not isinstance(parts, list) or len(parts) > MAX_PARTS:
        raise ApiError(400, "invalid_result_parts")
    out = []
    for item in parts:
        # JS: ``!item || typeof item !== "object"``; ``{}`` and ``[]`` are truthy objects there.
        if not isinstance(item, (dict, list)):
            raise ApiError(400, "invalid_result_part")
        item = item if isinstance(item, dict) else {}
        if "timeCode" in item and not isinstance(item["timeCode"], str):
            raise ApiError(400, "invalid_result_part_timecode")
        if not isinstance(item.get("text"), str):
            raise ApiError(400, "invalid_result_part_text")
        out.append({k: item[k] for k in ("timeCode", "text") if k in item})
    return out


def _common(body: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    if "language" in body:
        if not isinstance(body["language"], str):
            raise ApiError(400, "invalid_language")
        fields["recognitionLanguage"] = body["language"]
    if "engine" in body:
        if not isinstance(body["engine"], str):
            raise ApiError(400, "invalid_engine")
        fields["workerEngine"] = body["engine"]
    if "duration" in body:
        d = body["duration"]
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or d < 0:
            raise ApiError(400, "invalid_duration")
        fields["duration"] = d
    if "metadata" in body:
        if not isinstance(body["metadata"], dict):
            raise ApiError(400, "invalid_engine_metadata")
        fields["workerEngineMetadata"] = body["metadata"]
    return fields


def progress_fields(body: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    text = body.get("text")
    if "text" in body:
        if not isinstance(text, str):
            raise ApiError(400, "invalid_progress_text")
        if js_len(text) > MAX_TEXT:
            raise ApiError(400, "progress_text_too_large")
        fields["partialResultText"] = text
    parts = _parts(body)
    if parts is not None:
        fields["partialResultParts"] = parts
    if not (text or "").strip() and not parts:
        raise ApiError(400, "progress_text_required")
    return _common(body, fields)


def result_fields(body: dict[str, Any]) -> dict[str, Any]:
    text = body.get("text")
    if not isinstance(text, str):
        raise ApiError(400, "result_text_required")
    if js_len(text) > MAX_TEXT:
        raise ApiError(400, "result_text_too_large")
    fields: dict[str, Any] = {"resultText": text}
    parts = _parts(body)
    if parts is not None:
        fields["resultParts"] = parts
    return _common(body, fields)
