"""protojson for ``cairn.worker.v1.JobResult``, and the failure envelope (contract §6)."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import TypeAdapter

from workers.cairn.contract.pb.cairn.worker.v1 import worker_pb2 as pb

JobResult = pb.JobResult
ERROR_CLASS_BY_CODE = {"needs_reauth": "ERROR_CLASS_AUTH_EXPIRED", "not_found": "ERROR_CLASS_NOT_FOUND",
                       "rate_limited": "ERROR_CLASS_RATE_LIMITED"}
GO_ZERO_TIME = "0001-01-01T00:00:00Z"  # what Go emits for an unset time.Time
M = TypeVar("M", bound=Message)


def encode_message(message: Message) -> bytes:
    """Compact protojson of any contract message (lowerCamel, enum names, int64 strings).

    ``json_format`` defaults, never ``preserving_proto_field_name``: Timestamps RFC 3339 ``Z``,
    Durations ``"3600s"``, zero scalars omitted (reference §1.1, §6 "Encoding pitfalls").
    """
    return json.dumps(json_format.MessageToDict(message), separators=(",", ":")).encode()


def decode_message(data: bytes | str, message: M) -> M:
    """Strict protojson into ``message`` (unknown fields raise ``json_format.ParseError``)."""
    return json_format.Parse(data, message, ignore_unknown_fields=False)


def encode_result(result: pb.JobResult) -> bytes:
    """Compact protojson bytes; hash and upload exactly these bytes.

    The one place result bytes are produced: Go's protojson varies whitespace, so nothing
    compares serialized bytes, only the sha256 of the exact uploaded body.
    """
    return json.dumps(json_format.MessageToDict(result), separators=(",", ":")).encode()


def decode_job_result(data: bytes | str) -> pb.JobResult:
    """Strict protojson → JobResult; unknown fields, enum names or members raise ``ParseError``.

    As strict as core's parse, so a result core would Term as ``bad_payload`` fails here first.
    """
    return json_format.Parse(data, pb.JobResult(), ignore_unknown_fields=False)


decode_result = decode_job_result


def result_to_dict(result: pb.JobResult) -> dict[str, Any]:
    """The protojson dict (lowerCamel) of a JobResult."""
    return json_format.MessageToDict(result)


def result_from_dict(body: dict[str, Any]) -> pb.JobResult:
    """A JobResult from a protojson dict (strict: a field outside the schema fails here, not at core)."""
    return json_format.ParseDict(body, pb.JobResult(), ignore_unknown_fields=False)


def sha256_hex(data: bytes) -> str:
    """Lower-case hex digest: the presign request's ``content_sha256`` and ``PayloadRef``'s."""
    return hashlib.sha256(data).hexdigest()


def sha256_b64(data: bytes) -> str:
    """Base64 of the raw digest: the ``x-amz-checksum-sha256`` header value S3 checks."""
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def hex_to_b64(hex_digest: str) -> str:
    """Convert a hex sha256 (as sent to core) to the S3 checksum header form; validates length."""
    raw = bytes.fromhex(hex_digest)
    if len(raw) != 32:
        raise ValueError("content sha256 must be a hex-encoded sha-256 digest")
    return base64.b64encode(raw).decode()


def rfc3339(ts: datetime) -> str:
    """RFC 3339 in UTC with ``Z`` (Go parses nothing without a zone)."""
    if ts.tzinfo is None:
        raise ValueError("naive datetime: a wire timestamp needs a zone")
    ts = ts.astimezone(UTC)
    text = ts.strftime("%Y-%m-%dT%H:%M:%S")
    if ts.microsecond:
        text += f".{ts.microsecond:06d}".rstrip("0")
    return text + "Z"


def parse_rfc3339(text: str | None) -> datetime | None:
    """Go's RFC 3339 (up to 9 fractional digits, ``Z`` or offset); Go's zero time → None."""
    if not text or text.startswith("0001-01-01"):
        return None
    value = TypeAdapter(datetime).validate_python(text)
    if value.tzinfo is None:
        raise ValueError("timestamp without a zone")
    return value.astimezone(UTC)


def timestamp(ts: datetime) -> Timestamp:
    """A ``google.protobuf.Timestamp`` from an aware datetime."""
    if ts.tzinfo is None:
        raise ValueError("naive datetime: a wire timestamp needs a zone")
    out = Timestamp()
    out.FromDatetime(ts.astimezone(UTC))
    return out


def stamp(result: pb.JobResult, *, worker_name: str, worker_version: str, worker_package: str) -> pb.JobResult:
    """The worker stamp every JobResult carries (contract §1, C3)."""
    result.worker_name, result.worker_version, result.worker_package = (
        worker_name, worker_version, worker_package)
    return result


def failure_envelope(*, code: str, message: str, user_id: str, provider: str, account_id: str,
                     external_id: str, error_class: str | None = None) -> pb.JobResult:
    """A JobResult with only ``error`` and ``failed_ref`` (+ the stamp, added by the caller)."""
    result = pb.JobResult()
    result.error.code = code
    result.error.message = message[:500]
    setattr(result.error, "class", pb.ErrorClass.Value(
        error_class or ERROR_CLASS_BY_CODE.get(code, "ERROR_CLASS_INVALID_INPUT")))
    result.failed_ref.user_id = user_id
    result.failed_ref.provider = provider
    result.failed_ref.external_account_id = account_id
    result.failed_ref.external_id = external_id
    return result
