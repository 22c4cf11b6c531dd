"""protojson for ``cairn.worker.v1.JobResult``, and the failure envelope (contract §6).

Encoding with protobuf's ``json_format``: lowerCamel names (the default; never
``preserving_proto_field_name``), enums as names, int64 as strings. Decoding
is strict (unknown fields are an error), exactly as core parses.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from google.protobuf import json_format

from workers.cairn import subjects
from workers.cairn.pb.cairn.worker.v1 import worker_pb2 as pb

JobResult = pb.JobResult
ERROR_CLASS_BY_CODE = {"needs_reauth": "ERROR_CLASS_AUTH_EXPIRED", "not_found": "ERROR_CLASS_NOT_FOUND",
                       "rate_limited": "ERROR_CLASS_RATE_LIMITED"}
PUBLISH_TIMEOUT_S = 10.0


def encode_result(result: pb.JobResult) -> bytes:
    """Compact protojson bytes; hash and upload exactly these bytes."""
    return json.dumps(json_format.MessageToDict(result), separators=(",", ":")).encode()


def decode_job_result(data: bytes | str) -> pb.JobResult:
    """Strict protojson → JobResult; unknown fields, enum names or members raise ``ParseError``."""
    return json_format.Parse(data, pb.JobResult(), ignore_unknown_fields=False)


def result_from_dict(body: dict[str, Any]) -> pb.JobResult:
    """A JobResult from a protojson dict (strict: a field outside the schema fails here, not at core)."""
    return json_format.ParseDict(body, pb.JobResult(), ignore_unknown_fields=False)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    result.error.__setattr__("class", pb.ErrorClass.Value(
        error_class or ERROR_CLASS_BY_CODE.get(code, "ERROR_CLASS_INVALID_INPUT")))
    result.failed_ref.user_id = user_id
    result.failed_ref.provider = provider
    result.failed_ref.external_account_id = account_id
    result.failed_ref.external_id = external_id
    return result


async def publish_failure_envelope(js: Any, *, settings: Any, provider: Any, kind: str,
                                   raw_job: Any, delivery: int, code: str, message: str) -> None:
    """Publish the envelope for a job the bridge terms itself (poison payload, delivery cap).

    Fields come best-effort from the raw body (it may be anything); the message
    is ours and carries no input value.
    """
    raw = raw_job if isinstance(raw_job, dict) else {}
    field = lambda name: str(raw.get(name) or "")[:200]  # noqa: E731
    prov = str(settings.provider)
    result = failure_envelope(code=code, message=message, user_id=field("user_id"), provider=prov,
                              account_id=field("account_id"), external_id=field("ext_id"))
    stamp(result, worker_name=settings.worker_name, worker_version=str(provider.parser_version),
          worker_package=settings.worker_package)
    job_id = field("job_id") or field("ext_id") or "unknown"
    if kind == subjects.RECONCILE and raw.get("account_id"):
        subject = subjects.reconcile_result_subject(prov, field("account_id"))
    else:
        subject = subjects.result_subject(kind, prov, settings.worker_name)
    await js.publish(subject, encode_result(result), timeout=PUBLISH_TIMEOUT_S,
                     headers={"Nats-Msg-Id": subjects.failure_msg_id(prov, job_id, delivery)})
