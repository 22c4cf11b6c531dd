"""parse_blob: quota-free re-parse of an archived raw blob (contract §1, §4; reference §3.10)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from workers.cairn.claimcheck import DownloadError
from workers.cairn.contract.jobs import ParseBlobJob
from workers.cairn.contract.subjects import activity_result_msg_id
from workers.cairn.disposition import HANDOVER_NAK_DELAY_S, Disposition, ack, nak
from workers.cairn.handlers.context import Delivery, JobContext, result_subject
from workers.cairn.handlers.failure import Permanent
from workers.cairn.handlers.fetch_source import publish_results
from workers.providers.kinds import PARSE_BLOB

log = logging.getLogger(__name__)

EXPIRED_STATUSES = frozenset({400, 403})  # S3: 403 "Request has expired" (400 for some signers)
MAX_ARCHIVE_BYTES = 64 * 1024 * 1024  # the published worker's archive download bound


def _expired(expires_at: datetime | None) -> bool:
    return expires_at is not None and expires_at.astimezone(UTC) <= datetime.now(UTC)


def read_archive(ctx: JobContext, job: ParseBlobJob) -> tuple[bytes, str]:
    """The archive bytes and the blob key the activity should name (the fallback handle).

    An expired URL (past ``expires_at``, or S3's 403) is re-presigned through
    ``cairn.blobs.presign_download.<provider>`` with the raw blob key.
    """
    url, handle = job.blob.url, job.blob.fallback_handle
    if _expired(job.blob.expires_at):
        if not handle:
            raise Permanent("no_blob_handle", "presigned URL expired and no fallback handle")
        url = ctx.claimcheck.presign_download(handle).url
    response = ctx.claimcheck.get(url)
    if response.status_code in EXPIRED_STATUSES and handle:
        log.info("parse_blob: presigned GET refused (HTTP %d); re-presigning", response.status_code)
        response = ctx.claimcheck.get(ctx.claimcheck.presign_download(handle).url)
    if not 200 <= response.status_code < 300:
        raise DownloadError(f"archive GET: HTTP {response.status_code}")
    if len(response.content) > MAX_ARCHIVE_BYTES:
        raise Permanent("archive_too_large", f"archive of {len(response.content)} bytes")
    return response.content, handle


def handle(ctx: JobContext, job: ParseBlobJob, delivery: Delivery) -> Disposition:
    """Re-parse with the import's own parser: the results are byte-identical to the import's.

    ``min_parser_version`` was judged once, at admission; it is not judged again here.
    """
    raw, blob_id = read_archive(ctx, job)
    outcome = ctx.provider.parse_blob(raw, job)
    if blob_id:
        outcome.attach_raw_blob(blob_id, size_bytes=len(raw), content_type=ctx.provider.archive_content_type)
    if delivery.is_lost:  # another copy owns the message now: publishing too would ingest twice
        return nak(HANDOVER_NAK_DELAY_S, reason="lease lost before publishing", failure=False)
    publish_results(ctx, result_subject(PARSE_BLOB, ctx.provider_name, ctx.worker_name), outcome,
                    activity_result_msg_id(job.job_id, delivery.attempt))
    log.info("parse_blob %s re-parsed (%d events, %d segment events)", outcome.ext_id,
             len(outcome.wire_events), len(outcome.segment_events))
    return ack()
