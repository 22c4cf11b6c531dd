"""Claim-check results and blob transfer through presigned URLs (contract §5, reference §3.9)."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import httpx
from google.protobuf import json_format
from pydantic import ValidationError

from workers.cairn.contract import subjects, wire
from workers.cairn.contract.messages import (
    PresignDownloadReply,
    PresignDownloadRequest,
    PresignUploadReply,
    PresignUploadRequest,
)
from workers.cairn.contract.pb.cairn.worker.v1 import worker_pb2 as pb
from workers.cairn.nats_conn import CoreRequestError, CoreUnanswered, request_json
from workers.cairn.routing import PUBLISH_RETRY_BOUND_S, PUBLISH_RETRY_INITIAL_S, PUBLISH_RETRY_MAX_S, PublishRouter
from workers.errors import PermanentJobError, RetryableJobError

log = logging.getLogger(__name__)

RESULT_CONTENT_TYPE = "application/json"
KIND_RESULT = "result"
KIND_RAW = "raw"
SEGMENT_MSG_ID_SUFFIX = ":seg"  # result:<job_id>:d<n>:seg follows result:<job_id>:d<n>
PRESIGN_TIMEOUT_S = 5.0  # the published worker uses 3 s; core may sign slowly under load
PUT_TIMEOUT_S = 30.0  # reference §3.9: 30 s client timeout for one body


class ClaimCheckError(RetryableJobError):
    """A claim-check step failed; transient: NAK the job and retry, never drop the body."""

    code = "claim_check"


class PresignError(ClaimCheckError):
    """Core did not presign (no responder, timeout, ``Nats-Error``, malformed reply)."""

    code = "presign_failed"


class UploadError(ClaimCheckError):
    """The presigned PUT failed (network or non-2xx)."""

    code = "upload_failed"


class DownloadError(ClaimCheckError):
    """A presigned GET failed at the network level (an HTTP status is the caller's to judge)."""

    code = "download_failed"


class BadResult(PermanentJobError):
    """The result does not fit the contract schema (a mapping bug or unmappable data): envelope + Term."""

    code = "unmappable"


@dataclasses.dataclass(frozen=True)
class WorkerStamp:
    """``worker_name``, ``worker_version`` (parser ``N.M``), ``worker_package``: on every result (C3)."""

    worker_name: str
    worker_version: str
    worker_package: str

    def apply(self, result: pb.JobResult) -> pb.JobResult:
        return wire.stamp(result, worker_name=self.worker_name, worker_version=self.worker_version,
                          worker_package=self.worker_package)


@dataclasses.dataclass(frozen=True)
class UploadedBlob:
    """What a finished upload left in S3: core's key verbatim plus what we sent."""

    blob_id: str
    size_bytes: int
    content_type: str
    content_sha256: str

    def payload_ref(self) -> pb.PayloadRef:
        return pb.PayloadRef(blob_id=self.blob_id, size_bytes=self.size_bytes,
                             content_type=self.content_type, content_sha256=self.content_sha256)


class ClaimCheck:
    """Presign → PUT → publish envelope, inline results and blob transfer, for one provider pool.

    Event-carrying results routinely exceed the broker's ``max_payload``, so the full
    ``JobResult`` is marshalled once, hashed, uploaded through a URL core presigns, and only an
    envelope (worker stamp + ``payload_ref``) is published. The sha256 travels as hex to core and
    core's base64 ``x-amz-checksum-sha256`` back to S3 untouched. Every failure raises (a
    :class:`ClaimCheckError` is transient, NAK and retry): a result body is never dropped.
    Messages name the step and a status only: presigned URLs carry signatures (S1). Sync on top
    of ``NatsThread``; connection objects are resolved in the calling thread, never on the loop.

    One per process (``JobContext.claimcheck``), sharing the process's NATS
    thread and publish router; the HTTP client for presigned URLs is created
    on first use, so a context that only publishes envelopes (the bridge's) never opens one.
    """

    def __init__(self, nats: Any, *, provider: str, stamp: WorkerStamp, http: httpx.Client | None = None,
                 router: PublishRouter | None = None, presign_timeout_s: float = PRESIGN_TIMEOUT_S,
                 presign_retry_bound_s: float = PUBLISH_RETRY_BOUND_S) -> None:
        self._nats = nats
        self.provider = provider
        self.stamp = stamp
        self._http = http
        self.router = router or PublishRouter(nats)
        self.presign_timeout_s = presign_timeout_s
        self.presign_retry_bound_s = presign_retry_bound_s

    @property
    def http(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(timeout=PUT_TIMEOUT_S)
        return self._http

    # ------------------------------------------------------------------ core request/reply

    def _request(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        """A presign, asked again while it goes unanswered (up to ``presign_retry_bound_s``).

        Presigning is idempotent, and giving up mid-result is not: a delivery that stored its
        activity result and then could not presign its segment companion (a partition) was
        NAKed and run again, storing both results twice. No responder, or a refusal, is an
        answer: that fails at once.
        """
        deadline = time.monotonic() + self.presign_retry_bound_s
        delay = PUBLISH_RETRY_INITIAL_S
        while True:
            try:
                reply = request_json(self._nats, subject, body, self.presign_timeout_s)
                break
            except CoreUnanswered as exc:
                if time.monotonic() + delay >= deadline:
                    raise PresignError(str(exc)) from None
                log.info("%s; again in %.1fs", exc, delay)
            except CoreRequestError as exc:
                raise PresignError(str(exc)) from None
            time.sleep(delay)  # NATS unreachable: nothing to await but its return
            delay = min(delay * 2, PUBLISH_RETRY_MAX_S)
        if reply.get("error"):
            raise PresignError(f"request {subject}: {str(reply['error'])[:200]}")
        return reply

    def presign_upload(self, *, kind: str, body: bytes, content_type: str, user_id: str | None = None,
                       source_id: str | None = None) -> PresignUploadReply:
        """A presigned PUT bound to ``body``'s length and sha256."""
        request = PresignUploadRequest(provider=self.provider, kind=kind, content_type=content_type,
                                       content_length=len(body), content_sha256=wire.sha256_hex(body),
                                       user_id=user_id or None, source_id=source_id or None)
        reply = self._request(subjects.presign_upload_subject(self.provider), request.to_wire())
        try:
            return PresignUploadReply.model_validate(reply)
        except ValidationError:
            raise PresignError(f"presign upload ({kind}): reply without url or blob_id") from None

    def presign_download(self, blob_id: str) -> PresignDownloadReply:
        """A fresh presigned GET (parse_blob with an expired URL: the fallback handle is the key)."""
        request = PresignDownloadRequest(blob_id=blob_id, handle=blob_id)
        reply = self._request(subjects.presign_download_subject(self.provider), request.to_wire())
        try:
            return PresignDownloadReply.model_validate(reply)
        except ValidationError:
            raise PresignError("presign download: reply without url") from None

    # ------------------------------------------------------------------ blob transfer

    def put(self, presigned: PresignUploadReply, body: bytes, content_type: str) -> None:
        """PUT ``body`` sending every ``required_headers`` entry verbatim (case-insensitively de-duplicated)."""
        headers: dict[str, str] = {}
        seen: set[str] = set()
        for name, value in presigned.required_headers.items():
            lower = name.lower()
            if lower in seen or lower == "host":  # httpx derives Host from the URL, which was signed
                continue
            seen.add(lower)
            headers[name] = str(value)
        if "content-type" not in seen:
            headers["Content-Type"] = content_type
        method = (presigned.method or "PUT").upper()
        try:
            response = self.http.request(method, presigned.url, content=body, headers=headers,
                                         timeout=PUT_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise UploadError(f"blob {method}: {type(exc).__name__}") from None
        if not 200 <= response.status_code < 300:
            raise UploadError(f"blob {method}: HTTP {response.status_code}")

    def get(self, url: str) -> httpx.Response:
        """GET a presigned URL; the caller decides what a 403/404 means (expired, gone)."""
        try:
            return self.http.get(url, timeout=PUT_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise DownloadError(f"blob GET: {type(exc).__name__}") from None

    def upload(self, *, kind: str, body: bytes, content_type: str, user_id: str | None = None,
               source_id: str | None = None) -> UploadedBlob:
        """Presign and PUT ``body``; ``kind`` is ``result`` or ``raw`` (a dataset-N archive)."""
        presigned = self.presign_upload(kind=kind, body=body, content_type=content_type, user_id=user_id,
                                        source_id=source_id)
        self.put(presigned, body, content_type)
        return UploadedBlob(blob_id=presigned.blob_id, size_bytes=len(body), content_type=content_type,
                            content_sha256=wire.sha256_hex(body))

    # ------------------------------------------------------------------ results

    def publish_claim_checked(self, subject: str, result: pb.JobResult, msg_id: str) -> UploadedBlob:
        """Upload the full stamped result, then publish only the envelope (stamp + watermark + payload_ref)."""
        full = pb.JobResult()
        full.CopyFrom(result)
        self.stamp.apply(full)
        body = wire.encode_result(full)
        blob = self.upload(kind=KIND_RESULT, body=body, content_type=RESULT_CONTENT_TYPE)
        envelope = self.stamp.apply(pb.JobResult())
        if full.HasField("new_watermark"):
            envelope.new_watermark.CopyFrom(full.new_watermark)
        envelope.more_available = full.more_available
        envelope.payload_ref.CopyFrom(blob.payload_ref())
        self.router.publish(subject, wire.encode_result(envelope), msg_id)
        return blob

    def publish_inline(self, subject: str, result: pb.JobResult, msg_id: str) -> None:
        """Event-free results (reconcile watermark, failure envelope, a small gear list) go inline."""
        inline = pb.JobResult()
        inline.CopyFrom(result)
        self.router.publish(subject, wire.encode_result(self.stamp.apply(inline)), msg_id)

    def publish_result(self, subject: str, result: pb.JobResult, msg_id: str) -> UploadedBlob | None:
        """Claim-check when the result carries events (MUST), inline otherwise."""
        if len(result.events):
            return self.publish_claim_checked(subject, result, msg_id)
        self.publish_inline(subject, result, msg_id)
        return None


class UserBlobSink:
    """A provider's ``BlobSink``: durable uploads under the user's layout through this claim-check.

    Mirrored media (Strava photos) are durable, not transfer bodies: presign
    kind ``raw`` with the user id, so core mints ``users/<user>/<provider>/…``
    and keeps the object (the ``transfer/`` lifecycle rule would reap it).
    """

    def __init__(self, claimcheck: ClaimCheck) -> None:
        self._claimcheck = claimcheck

    def upload(self, body: bytes, content_type: str, user_id: str) -> str:
        return self._claimcheck.upload(kind=KIND_RAW, body=body, content_type=content_type,
                                       user_id=user_id).blob_id


def segment_result_msg_id(activity_msg_id: str) -> str:
    """The second result's msg id: the activity result's plus ``:seg`` (reference §3.6 step 11)."""
    return activity_msg_id + SEGMENT_MSG_ID_SUFFIX


def strict_result(body: dict[str, Any]) -> pb.JobResult:
    """A ``JobResult`` from a protojson dict, strictly: a field outside the schema is :class:`BadResult`.

    Core parses results with unknown fields rejected (reference §1.1), so a
    mapping bug fails here, in the worker, as a permanent error instead of
    being Term'd by core as ``bad_payload``.
    """
    try:
        return wire.result_from_dict(body)
    except json_format.ParseError as exc:
        raise BadResult(f"result does not fit cairn.worker.v1.JobResult: {str(exc)[:200]}") from None
