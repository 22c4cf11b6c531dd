"""Publishing ``JobResult``s: strict protojson, claim-check through presigned URLs, raw archives.

Why strict: core parses results with unknown fields rejected (reference §1.1),
so every result is parsed into the generated ``cairn.worker.v1.JobResult``
first; a field outside the contract fails here, in the worker, as a
permanent error, instead of being Term'd by core. Why claim-check: event
bodies routinely exceed the broker's max_payload (contract §5), so the full
result goes to S3 via a presigned PUT and only a small envelope with the
``payload_ref`` is published. Any presign, PUT or publish failure is a
:class:`BlobTransferError` (transient → NAK): a result body is never dropped.

The worker holds no S3 credentials (S2): every blob goes through URLs core
presigns; their signatures never reach a log or an exception text.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any

import httpx

from workers.errors import PermanentJobError, RetryableJobError

if TYPE_CHECKING:
    from workers.cairn.handlers.context import JobContext

log = logging.getLogger(__name__)

RESULT_CONTENT_TYPE = "application/json"
KIND_RESULT = "result"
KIND_RAW = "raw"
PRESIGN_TIMEOUT_S = 5.0
JOB_RESULT = "cairn.worker.v1.JobResult"


class BlobTransferError(RetryableJobError):
    """Presign, PUT/GET or publish failed: NAK and retry, never drop the body."""


class BadResult(PermanentJobError):
    """The result does not fit the contract schema (a mapping bug or unmappable data)."""

    code = "unmappable"


def encode_result(result: dict[str, Any]) -> bytes:
    """Validate ``result`` (protojson dict) against the schema and serialize it once."""
    from google.protobuf import json_format

    from workers.cairn import wire

    try:
        message = wire.result_from_dict(result)
    except json_format.ParseError as exc:
        raise BadResult(f"result does not fit {JOB_RESULT}: {str(exc)[:200]}") from None
    return wire.encode_result(message)


def presign_upload(ctx: JobContext, *, kind: str, body: bytes, content_type: str,
                   user_id: str = "") -> dict[str, Any]:
    """Ask core for a presigned PUT of ``body`` (sha256-bound)."""
    from workers.cairn.handlers.context import CoreRequestError, presign_subject

    request: dict[str, Any] = {"provider": ctx.provider_name, "kind": kind, "content_type": content_type,
                               "content_length": len(body),
                               "content_sha256": hashlib.sha256(body).hexdigest()}
    if user_id:
        request["user_id"] = user_id
    try:
        reply = ctx.request(presign_subject(ctx.provider_name, "upload"), request, PRESIGN_TIMEOUT_S)
    except CoreRequestError as exc:
        raise BlobTransferError(f"presign upload ({kind}): {exc}") from None
    if not reply.get("url") or not reply.get("blob_id"):
        raise BlobTransferError(f"presign upload ({kind}): reply without url or blob_id")
    return reply


def presign_download(ctx: JobContext, blob_id: str) -> str:
    """A fresh presigned GET for ``blob_id`` (the parse_blob fallback handle)."""
    from workers.cairn.handlers.context import CoreRequestError, presign_subject

    try:
        reply = ctx.request(presign_subject(ctx.provider_name, "download"),
                            {"blob_id": blob_id, "handle": blob_id}, PRESIGN_TIMEOUT_S)
    except CoreRequestError as exc:
        raise BlobTransferError(f"presign download: {exc}") from None
    if not reply.get("url"):
        raise BlobTransferError("presign download: reply without url")
    return str(reply["url"])


def put_blob(ctx: JobContext, presigned: dict[str, Any], body: bytes, content_type: str) -> None:
    """PUT ``body`` with every ``required_headers`` entry verbatim (case-insensitively de-duplicated)."""
    headers: dict[str, str] = {}
    seen: set[str] = set()
    for name, value in (presigned.get("required_headers") or {}).items():
        if name.lower() in seen or name.lower() == "host":  # httpx sends Host from the URL itself
            continue
        seen.add(name.lower())
        headers[name] = str(value)
    if "content-type" not in seen:
        headers["Content-Type"] = content_type
    method = str(presigned.get("method") or "PUT").upper()
    try:
        response = ctx.blob_http.request(method, str(presigned["url"]), content=body, headers=headers)
    except httpx.HTTPError as exc:
        raise BlobTransferError(f"blob {method}: {type(exc).__name__}") from None
    if not 200 <= response.status_code < 300:
        raise BlobTransferError(f"blob {method}: HTTP {response.status_code}")


def get_blob(ctx: JobContext, url: str) -> httpx.Response:
    """GET a presigned URL; the caller decides what a 403/404 means."""
    try:
        return ctx.blob_http.get(url)
    except httpx.HTTPError as exc:
        raise BlobTransferError(f"blob GET: {type(exc).__name__}") from None


def archive_raw(ctx: JobContext, body: bytes, content_type: str, user_id: str) -> str:
    """Upload the dataset-N raw archive (kind ``raw``); returns core's key verbatim."""
    presigned = presign_upload(ctx, kind=KIND_RAW, body=body, content_type=content_type, user_id=user_id)
    put_blob(ctx, presigned, body, content_type)
    return str(presigned["blob_id"])


def publish_inline(ctx: JobContext, subject: str, result: dict[str, Any], msg_id: str) -> None:
    """Event-free results (reconcile, failure envelopes, small gear lists) go inline."""
    _publish(ctx, subject, encode_result(result), msg_id)


def publish_claim_checked(ctx: JobContext, subject: str, result: dict[str, Any], msg_id: str) -> str:
    """Upload the full result, then publish the envelope: stamp + ``payload_ref``. Returns the blob id."""
    body = encode_result(result)
    presigned = presign_upload(ctx, kind=KIND_RESULT, body=body, content_type=RESULT_CONTENT_TYPE)
    put_blob(ctx, presigned, body, RESULT_CONTENT_TYPE)
    envelope: dict[str, Any] = dict(ctx.stamp())
    for key in ("newWatermark", "moreAvailable"):
        if key in result:
            envelope[key] = result[key]
    envelope["payloadRef"] = {"blobId": str(presigned["blob_id"]), "sizeBytes": str(len(body)),
                              "contentType": RESULT_CONTENT_TYPE,
                              "contentSha256": hashlib.sha256(body).hexdigest()}
    _publish(ctx, subject, encode_result(envelope), msg_id)
    return str(presigned["blob_id"])


def _publish(ctx: JobContext, subject: str, data: bytes, msg_id: str) -> None:
    try:
        ctx.publish(subject, data, msg_id)
    except Exception as exc:  # noqa: BLE001 - timeout, no stream, disconnected: all transient
        raise BlobTransferError(f"publish {subject}: {type(exc).__name__}") from None
