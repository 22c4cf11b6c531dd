"""Result router of the dev core: ingest ``cairn.results.>`` like core 0.7 does.

Reference §2.7 describes the published router; contract 0.7 adds the checks a
strict double must make so a worker bug fails a test instead of slipping
through: claim-checked bodies are verified (key layout, size, SHA-256),
``worker_name`` must equal the pool token of the subject, a pool name is bound
to the first package it reports, an activity must come from the account's pool
(or, for ``parse_blob``, from the package that imported the source), and a
source's parser version never goes down. Decoding is strict protojson (unknown
fields rejected). Every decision is recorded for tests to assert on.

A reconcile result is one only on ``cairn.results.reconcile.<provider>.<account
uuid>`` (exactly 5 tokens, §2.7). Any other reconcile subject (a non-UUID
account, or a 6-token ``...<pool>.<account>``) is what core logs and *acks*
without touching the account: no watermark, no ``last_sync_at``. The double
records it as a rejection (``acked``) and acks it too, so a worker that
publishes there sees exactly what production would do: nothing happens.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from devstack.fakes.cairn_core.accounts import AccountRegistry, is_uuid, utcnow
from devstack.fakes.cairn_core.blobs import BlobStore, key_provider_ok

EVENT_ONEOF = "entity"
ONEOF_TO_TYPE = {"activity": "ACTIVITY", "segment": "SEGMENT", "segment_effort": "SEGMENT_EFFORT",
                 "record": "RECORD", "metric": "METRIC", "gear": "GEAR"}


class Rejected(Exception):
    """A result core refuses (Term); ``reason`` is the machine code recorded for tests."""

    def __init__(self, reason: str, detail: str = "", *, ack: bool = False) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail
        self.ack = ack  # core acks it (ignored, logged) instead of terming it


@dataclass
class IngestedResult:
    """One accepted result, materialised (the claim-checked body when there was one)."""

    subject: str
    job_type: str
    provider: str
    pool: str | None
    kind: str  # "events" | "segments" (only SEGMENT/SEGMENT_EFFORT events) | "reconcile" | "failure"
    result: Message
    msg_id: str | None = None
    account_id: str | None = None
    claim_checked: bool = False
    blob_id: str | None = None

    @property
    def data(self) -> dict[str, Any]:
        return json_format.MessageToDict(self.result)


@dataclass
class Rejection:
    subject: str
    reason: str
    detail: str
    msg_id: str | None = None
    acked: bool = False  # core ignores it with an ack (bad reconcile subject); else Term


@dataclass
class SourceRecord:
    version: tuple[int, int]
    package: str
    worker_name: str
    activity: Message


def parse_version(text: str) -> tuple[int, int]:
    """Parser version ``N.M`` (a legacy bare ``N`` reads as ``N.0``)."""
    parts = text.strip().split(".")
    if not text.strip() or len(parts) > 2 or not all(p.isdigit() for p in parts):
        raise Rejected("bad_worker_version", repr(text))
    return int(parts[0]), int(parts[1]) if len(parts) == 2 else 0


def parse_subject(subject: str, accounts: AccountRegistry) -> tuple[str, str, str | None, str | None]:
    """(job_type, provider, pool, reconcile account) from a 0.7 result subject.

    A reconcile subject that is not exactly ``...reconcile.<provider>.<uuid>``
    gives neither pool nor account; ``_process`` ignores it after the failure path.
    """
    tokens = subject.split(".")
    if len(tokens) < 4 or tokens[:2] != ["cairn", "results"]:
        raise Rejected("bad_subject", subject)
    job, provider = tokens[2], tokens[3]
    if job == "reconcile" and len(tokens) >= 5:
        if len(tokens) != 5 or not is_uuid(tokens[4]):
            return job, provider, None, None
        acct = accounts.for_provider(tokens[4], provider)
        if acct is None:
            raise Rejected("unknown_account", tokens[4])
        return job, provider, acct.worker_name, acct.account_id
    if len(tokens) == 5:
        return job, provider, tokens[4], None
    raise Rejected("legacy_subject" if len(tokens) == 4 else "bad_subject", subject)


class ResultRouter:
    """Holds the ingest state (sources, gear, bindings) and the record tests read."""

    def __init__(self, accounts: AccountRegistry, blobs: BlobStore, decode: Callable[[bytes], Message]) -> None:
        self.accounts, self.blobs, self.decode = accounts, blobs, decode
        self.cond = threading.Condition()
        self.ingested: list[IngestedResult] = []
        self.rejected: list[Rejection] = []
        self.sources: dict[tuple[str, str, str], SourceRecord] = {}
        self.gear: dict[tuple[str, str], Message] = {}
        self.package_bindings: dict[tuple[str, str], str] = {}
        # §2.7: SEGMENT find-or-create by (account, external id); an effort resolves its segment
        # (same message or stored) and its activity source, else core logs it and drops it.
        self.segments: dict[tuple[str, str], Message] = {}
        self.efforts: dict[tuple[str, str], Message] = {}
        self.unresolved_efforts: list[Message] = []

    # ---- entry point (loop thread) ---------------------------------------------------------
    async def handle(self, subject: str, data: bytes, msg_id: str | None) -> bool:
        """Process one message; True → ack, False → term (a rejection is recorded either way)."""
        try:
            record = await self._process(subject, data, msg_id)
        except Rejected as rej:
            with self.cond:
                self.rejected.append(Rejection(subject, rej.reason, rej.detail, msg_id, acked=rej.ack))
                self.cond.notify_all()
            return rej.ack
        with self.cond:
            self.ingested.append(record)
            self.cond.notify_all()
        return True

    async def _process(self, subject: str, data: bytes, msg_id: str | None) -> IngestedResult:
        job, provider, pool, account_id = parse_subject(subject, self.accounts)
        envelope = self._decode(data)
        base: dict[str, Any] = dict(subject=subject, job_type=job, provider=provider, pool=pool, msg_id=msg_id,
                                    account_id=account_id)
        if envelope.HasField("error"):
            return IngestedResult(kind="failure", result=envelope, **base)
        if job == "reconcile" and account_id is None:  # §2.7: core logs it and acks, applying nothing
            raise Rejected("bad_reconcile_subject", subject, ack=True)
        result, blob_id = envelope, None
        outer_name = envelope.worker_name
        if outer_name and pool is not None and outer_name != pool:  # refuse before touching S3
            raise Rejected("worker_name_mismatch", f"result {outer_name!r}, subject pool {pool!r}")
        if envelope.HasField("payload_ref"):
            result, blob_id = await self._fetch_claim_check(envelope, provider)
        self._check_identity(result, provider, pool)
        if job == "reconcile":
            self._apply_reconcile(result, provider, account_id)
            kind = "reconcile"
        else:
            self._ingest_events(result, job, provider)
            members = {e.WhichOneof(EVENT_ONEOF) for e in result.events}
            kind = "segments" if members and members <= {"segment", "segment_effort"} else "events"
        if blob_id is not None:
            await asyncio.to_thread(self.blobs.delete, blob_id)
        return IngestedResult(kind=kind, result=result, claim_checked=blob_id is not None,
                              blob_id=blob_id, **base)

    def _decode(self, data: bytes) -> Message:
        try:
            return self.decode(data)
        except Exception as exc:  # noqa: BLE001 - any parse failure is bad_payload
            raise Rejected("bad_payload", str(exc)[:300]) from None

    # ---- claim-check -----------------------------------------------------------------------
    async def _fetch_claim_check(self, envelope: Message, provider: str) -> tuple[Message, str]:
        ref = envelope.payload_ref
        if len(envelope.events):
            raise Rejected("inline_events_with_payload_ref")
        if not key_provider_ok(ref.blob_id, provider, results=True):
            raise Rejected("foreign_blob_key", ref.blob_id)
        body = await asyncio.to_thread(self.blobs.get, ref.blob_id)
        if body is None:
            raise Rejected("payload_missing", ref.blob_id)
        if len(body) != ref.size_bytes:
            raise Rejected("size_mismatch", f"object {len(body)} bytes, payload_ref {ref.size_bytes}")
        digest = hashlib.sha256(body).hexdigest()
        if digest != ref.content_sha256:
            raise Rejected("sha256_mismatch", f"object {digest}, payload_ref {ref.content_sha256!r}")
        result = self._decode(body)
        if result.HasField("payload_ref"):
            raise Rejected("nested_payload_ref")
        for name in ("worker_name", "worker_version", "worker_package"):
            outer = getattr(envelope, name)
            if outer and outer != getattr(result, name):
                raise Rejected("stamp_mismatch", f"{name}: envelope {outer!r}, body {getattr(result, name)!r}")
        return result, ref.blob_id

    # ---- identity --------------------------------------------------------------------------
    def _check_identity(self, result: Message, provider: str, pool: str | None) -> None:
        name, package = result.worker_name, result.worker_package
        if not name:
            raise Rejected("missing_worker_name")
        if pool is not None and name != pool:
            raise Rejected("worker_name_mismatch", f"result {name!r}, subject pool {pool!r}")
        parse_version(result.worker_version)
        if not package:
            raise Rejected("missing_worker_package")
        with self.cond:
            bound = self.package_bindings.setdefault((provider, name), package)
        if bound != package:
            raise Rejected("package_mismatch", f"pool {name!r} is bound to {bound!r}, got {package!r}")

    # ---- reconcile -------------------------------------------------------------------------
    def _apply_reconcile(self, result: Message, provider: str, account_id: str | None) -> None:
        acct = self.accounts.for_provider(account_id, provider)
        if acct is None:
            raise Rejected("unknown_account", str(account_id))
        if result.HasField("new_watermark"):
            new = result.new_watermark.ToDatetime(tzinfo=UTC)
            if new.year > 1 and (acct.sync_watermark is None or new > acct.sync_watermark):
                acct.sync_watermark = new
        acct.last_sync_at = utcnow()

    # ---- events ----------------------------------------------------------------------------
    def _ingest_events(self, result: Message, job: str, provider: str) -> None:
        staged_sources: dict[tuple[str, str, str], SourceRecord] = {}
        staged_gear: dict[tuple[str, str], Message] = {}
        staged_segments: dict[tuple[str, str], Message] = {}
        staged_efforts: list[Any] = []
        version = parse_version(result.worker_version)
        for index, event in enumerate(result.events):
            member = event.WhichOneof(EVENT_ONEOF)
            type_name = event.DESCRIPTOR.fields_by_name["type"].enum_type.values_by_number[event.type].name
            if member is None or not type_name.endswith("_" + ONEOF_TO_TYPE.get(member, "?")):
                raise Rejected("event_type_mismatch", f"event {index}: type {type_name}, member {member}")
            entity = getattr(event, member)
            if member == "activity":
                key = self._check_activity(entity, result, job, provider, version, index)
                staged_sources[key] = SourceRecord(version, result.worker_package, result.worker_name, entity)
            elif member == "gear":
                self._check_ref(entity.ref, provider, index)
                self._check_owner(entity.ref, index)
                staged_gear[(entity.ref.external_account_id, entity.ref.external_id)] = entity
            elif member == "segment":
                self._check_ref(entity.ref, provider, index)
                staged_segments[(entity.ref.external_account_id, entity.ref.external_id)] = entity
            elif member == "segment_effort":
                self._check_ref(entity.ref, provider, index)
                staged_efforts.append(entity)
            elif hasattr(entity, "ref"):
                self._check_ref(entity.ref, provider, index)
        with self.cond:
            self.sources.update(staged_sources)
            self.gear.update(staged_gear)
            self.segments.update(staged_segments)
            for effort in staged_efforts:
                account = effort.ref.external_account_id
                if ((account, effort.segment_external_id) in self.segments
                        and (provider, account, effort.activity_external_id) in self.sources):
                    self.efforts[(account, effort.ref.external_id)] = effort
                else:
                    self.unresolved_efforts.append(effort)
        for (_, account_id, _), rec in staged_sources.items():
            acct = self.accounts.get(account_id)
            start = rec.activity.payload.start_time.ToDatetime(tzinfo=UTC)
            if acct is not None and (acct.sync_watermark is None or start > acct.sync_watermark):
                acct.sync_watermark = start

    def _check_ref(self, ref: Message, provider: str, index: int) -> None:
        if not is_uuid(ref.user_id):
            raise Rejected("bad_user_id", f"event {index}")
        if ref.external_account_id and not is_uuid(ref.external_account_id):
            raise Rejected("bad_external_account_id", f"event {index}")
        if ref.provider != provider:
            raise Rejected("provider_mismatch", f"event {index}: {ref.provider!r}")
        if not ref.external_id:
            raise Rejected("missing_external_id", f"event {index}")

    def _check_owner(self, ref: Message, index: int) -> None:
        acct = self.accounts.get(ref.external_account_id) if ref.external_account_id else None
        if acct is not None and acct.user_id != ref.user_id:
            raise Rejected("user_mismatch", f"event {index}: ref.user_id is not the account owner")

    def _check_activity(self, act: Message, result: Message, job: str, provider: str,
                        version: tuple[int, int], index: int) -> tuple[str, str, str]:
        ref, payload = act.ref, act.payload
        self._check_ref(ref, provider, index)
        self._check_owner(ref, index)
        if not act.HasField("payload"):
            raise Rejected("missing_activity", f"event {index}")
        if payload.start_time.seconds <= 0 and payload.start_time.nanos == 0:
            raise Rejected("invalid", f"event {index}: zero start_time")
        if payload.elapsed_duration.seconds <= 0 and payload.elapsed_duration.nanos <= 0:
            raise Rejected("invalid", f"event {index}: elapsed <= 0")
        for attachment in act.attachments:
            blob_id = attachment.blob_id
            foreign_user = blob_id.startswith("users/") and blob_id.split("/")[1] != ref.user_id
            if blob_id and (foreign_user or not key_provider_ok(blob_id, provider, results=False)):
                raise Rejected("foreign_attachment_key", f"event {index}: {blob_id}")  # contract §5
        key = (provider, ref.external_account_id, ref.external_id)
        acct = self.accounts.get(ref.external_account_id) if ref.external_account_id else None
        existing = self.sources.get(key)
        if job == "parse_blob":
            if existing is not None and existing.package != result.worker_package:
                raise Rejected("not_source_package", f"event {index}: source imported by {existing.package!r}")
        elif acct is not None and acct.worker_name not in (None, result.worker_name):
            raise Rejected("wrong_pool", f"event {index}: account belongs to pool {acct.worker_name!r}")
        if existing is not None and version < existing.version:
            raise Rejected("version_downgrade",
                           f"event {index}: source at {existing.version}, result {version}")
        return key

    # ---- waiting (test thread) -------------------------------------------------------------
    def wait(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}; "
                                       f"ingested={len(self.ingested)} rejected="
                                       f"{[(r.reason, r.detail) for r in self.rejected[-5:]]}")
                self.cond.wait(remaining)


@dataclass
class DeadLetter:
    """A MAX_DELIVERIES advisory (metadata only, as core records it)."""

    stream: str
    consumer: str
    stream_seq: int
    deliveries: int
    at: datetime = field(default_factory=utcnow)
