"""parse_blob: quota-free re-parse of an archived raw blob (contract §1, §4; reference §3.10).

The blob is read through the presigned GET in the job; an expired URL (past
``expires_at``, or S3 answering 403) is re-presigned via
``cairn.blobs.presign_download.<provider>`` with the fallback handle (the raw
blob key). The provider's parser is the same function the import ran on the
same bytes, and the activity names the same raw blob (key, size, content
type), so the claim-checked body is byte-identical to the import's.

``min_parser_version``: the bridge already NAKs a job our parser must not
take (a higher version, or another dataset); it is checked again here
because a redelivered job can reach a task of an older image.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from workers.cairn.disposition import Disposition, ack, nak
from workers.cairn.handlers.failure import Permanent
from workers.cairn.handlers.fetch_source import activity_result
from workers.cairn.handlers.publish import (
    BlobTransferError,
    get_blob,
    presign_download,
    publish_claim_checked,
)
from workers.cairn.subjects import activity_result_msg_id

if TYPE_CHECKING:
    from workers.cairn.handlers.context import Delivery, JobContext

log = logging.getLogger(__name__)

KIND = "parse_blob"
ARCHIVE_CONTENT_TYPE = "application/json"
EXPIRED_STATUSES = frozenset({400, 403})  # S3: 403 "Request has expired" (400 for some signers)
MAX_ARCHIVE_BYTES = 64 * 1024 * 1024  # the published worker's archive download bound


def parser_refusal(job: Any, parser_version: str) -> str | None:
    """Why our parser must not take this job (a higher ``min_parser_version``, another dataset)."""
    wanted = str(getattr(job, "min_parser_version", "") or "").strip()
    if wanted in ("", "0", "0.0"):  # unset (the job model's default): any parser of ours may read it
        return None
    try:
        from workers.cairn.jobs import parser_refusal as wire_refusal
    except ImportError:
        wire_refusal = None
    if wire_refusal is not None:
        return wire_refusal(job, parser_version)
    ours, theirs = _version(parser_version), _version(wanted)
    if ours is None or theirs is None:
        return f"unreadable min_parser_version {wanted!r}"
    if theirs[0] != ours[0]:
        return f"source is dataset {theirs[0]}, this parser reads {ours[0]}"
    if theirs > ours:
        return f"source needs parser >= {wanted}, this is {parser_version}"
    return None


def _version(text: str) -> tuple[int, int] | None:
    parts = text.split(".")
    if not 1 <= len(parts) <= 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]) if len(parts) == 2 else 0


def _expired(expires_at: Any) -> bool:
    if expires_at is None or expires_at == "":
        return False
    if isinstance(expires_at, str):
        from workers.cairn.handlers.reconcile import parse_rfc3339

        expires_at = parse_rfc3339(expires_at)
    return isinstance(expires_at, datetime) and expires_at.astimezone(UTC) <= datetime.now(UTC)


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def read_archive(ctx: JobContext, job: Any) -> tuple[bytes, str]:
    """The archive bytes and the blob key the activity should name."""
    blob = _field(job, "blob") or {}
    url = str(_field(blob, "url") or "")
    handle = str(_field(blob, "fallback_handle") or "")
    if not url and not handle:
        raise Permanent("no_blob_handle", "parse_blob job without url and fallback handle")
    if not url or _expired(_field(blob, "expires_at")):
        if not handle:
            raise Permanent("no_blob_handle", "presigned URL expired and no fallback handle")
        url = presign_download(ctx, handle)
    response = get_blob(ctx, url)
    if response.status_code in EXPIRED_STATUSES and handle:
        log.info("parse_blob: presigned GET refused (HTTP %d); re-presigning", response.status_code)
        response = get_blob(ctx, presign_download(ctx, handle))
    if not 200 <= response.status_code < 300:
        raise BlobTransferError(f"archive GET: HTTP {response.status_code}")
    if len(response.content) > MAX_ARCHIVE_BYTES:
        raise Permanent("archive_too_large", f"archive of {len(response.content)} bytes")
    return response.content, handle


def handle(ctx: JobContext, job: Any, delivery: Delivery) -> Disposition:
    refusal = parser_refusal(job, ctx.provider.parser_version)
    if refusal:
        return nak(reason=f"parser refuses: {refusal}")
    raw, blob_id = read_archive(ctx, job)
    outcome = ctx.provider.parse_blob(raw, job)
    if blob_id:
        outcome.attach_raw_blob(blob_id, size_bytes=len(raw), content_type=ARCHIVE_CONTENT_TYPE)
    if delivery.is_lost:  # another copy owns the message now: publishing too would ingest twice
        return nak(reason="lease lost before publishing")
    from workers.cairn.handlers.context import result_subject

    publish_claim_checked(ctx, result_subject(KIND, ctx.provider_name, ctx.worker_name),
                          activity_result(ctx, outcome),
                          activity_result_msg_id(str(_field(job, "job_id") or f"ext-{outcome.ext_id}"),
                                                 delivery.attempt))
    log.info("parse_blob %s re-parsed (%d events)", outcome.ext_id, len(outcome.wire_events))
    return ack()
