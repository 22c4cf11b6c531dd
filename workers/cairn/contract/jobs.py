"""Pydantic models for the JSON job bodies core publishes (contract §4, reference §2.9)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from workers.cairn.contract import subjects
from workers.cairn.contract.messages import GoTime  # Go's zero time.Time (and "") mean unset


class _Job(BaseModel):
    """Unknown fields ignored (core adds more); required ones validated, so a poison payload fails here."""

    model_config = ConfigDict(extra="ignore")

    job_id: str = ""
    account_id: str = Field(min_length=1)
    user_id: str = Field(min_length=1)
    provider: str = ""


class FetchSourceJob(_Job):
    job_id: str = Field(min_length=1)
    ext_id: str = Field(min_length=1)
    fetch_streams: bool = True
    reason: str = ""


class ReconcileJob(_Job):
    """Contract §4 reconcile. ``user_id`` may be missing: the §10 conformance harness publishes
    ``{job_id, account_id, provider, max_enqueue}`` only (reference §5), and the Go worker decodes
    that without complaint. Sub-jobs need an owner, so the handler enqueues none without it."""

    job_id: str = Field(min_length=1)
    user_id: str = ""
    watermark: GoTime = None
    max_enqueue: int = Field(default=500, ge=0)
    known_ext_ids: list[str] = Field(default_factory=list)

    @field_validator("known_ext_ids", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        return [] if value is None else value


_VERSION = re.compile(r"[0-9]{1,9}\.[0-9]{1,9}")  # contract §1: parser versions are N.M
_LEGACY_VERSION = re.compile(r"[0-9]{1,9}")


class BlobRef(BaseModel):
    model_config = ConfigDict(extra="ignore")

    url: str = Field(min_length=1)
    expires_at: GoTime = None
    fallback_handle: str = ""


class ParseBlobJob(FetchSourceJob):
    blob: BlobRef
    min_parser_version: str | None = None
    source_id: str = ""

    @field_validator("min_parser_version", mode="before")
    @classmethod
    def _legacy_integer(cls, value: Any) -> str | None:
        """A legacy bare integer ``N`` reads as ``N.0`` (contract §1); anything but ``N.M`` is poison.

        Checked here, at admission, so ``"one.two"`` or ``"1.x"`` is a bad payload (envelope +
        term) and never reaches the version comparison, which would raise on every delivery.
        """
        if value is None or str(value).strip() == "":
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ValueError("min_parser_version must be a string N.M or an integer N")
        text = str(value).strip()
        if _LEGACY_VERSION.fullmatch(text):
            text = f"{int(text)}.0"
        if not _VERSION.fullmatch(text):
            raise ValueError("min_parser_version is not N.M")
        return text


class ImportGearJob(_Job):
    reason: str = ""


class ImportMetricsJob(_Job):
    since_unix: int
    until_unix: int


BACKFILL_DEFAULT_PAGE_SIZE = 100
BACKFILL_MAX_PAGE_SIZE = 200


class BackfillJob(_Job):
    """Legacy full-history walk (reference §3.12); core never issues it, a MAY for 0.7."""

    athlete_id: str | int | None = None
    since: datetime | None = None
    page_size: int = BACKFILL_DEFAULT_PAGE_SIZE
    max_activities: int | None = Field(default=None, ge=1)
    before: datetime | None = None
    after: datetime | None = None

    @field_validator("page_size", mode="before")
    @classmethod
    def _page_size(cls, value: Any) -> int:
        """1-200 as given, anything else the published default of 100."""
        try:
            size = int(value)
        except (TypeError, ValueError):
            return BACKFILL_DEFAULT_PAGE_SIZE
        return size if 1 <= size <= BACKFILL_MAX_PAGE_SIZE else BACKFILL_DEFAULT_PAGE_SIZE


JOB_MODELS: dict[str, type[_Job]] = {
    subjects.FETCH_SOURCE: FetchSourceJob, subjects.RECONCILE: ReconcileJob,
    subjects.PARSE_BLOB: ParseBlobJob, subjects.IMPORT_GEAR: ImportGearJob,
    subjects.IMPORT_METRICS: ImportMetricsJob, subjects.BACKFILL: BackfillJob,
}


def parse_job(kind: str, raw: Any) -> _Job:
    """Validate ``raw`` (a decoded JSON body) as a job of ``kind``; raises ``ValidationError``."""
    return JOB_MODELS[kind].model_validate(raw)


def parse_version(text: str) -> tuple[int, int]:
    major, _, minor = str(text).strip().partition(".")
    return int(major), int(minor or 0)




def parser_refusal(job: Any, parser_version: str) -> str | None:
    """Why a parse_blob must be NAKed for a newer pooled instance (contract §1), or None.

    ``min_parser_version`` above ours → NAK; another dataset (major) → NAK.
    """
    wanted = getattr(job, "min_parser_version", None)
    if wanted is None:
        return None
    want_n, want_m = parse_version(wanted)
    our_n, our_m = parse_version(parser_version)
    if want_n != our_n:
        return f"dataset {want_n} is not ours ({our_n})"
    if want_m > our_m:
        return f"min_parser_version {wanted} is above ours ({parser_version})"
    return None


# Request/reply bodies and KV records live in ``messages`` (one concept per module);
# re-exported here so callers find every contract JSON shape under ``jobs``.
from workers.cairn.contract.messages import (  # noqa: E402
    AccountLookupReply,
    AccountLookupRequest,
    AccountRequest,
    Capability,
    ConfigField,
    CredsReply,
    ManifestRecord,
    NeedsReauthRequest,
    OAuthExchangeError,
    OAuthExchangeRequest,
    OAuthMeta,
    OkReply,
    PresenceRecord,
    PresignDownloadReply,
    PresignDownloadRequest,
    PresignUploadReply,
    PresignUploadRequest,
    ProviderMeta,
    TokenReply,
    TokenStoreRequest,
)

__all__ = [
    "AccountLookupReply", "AccountLookupRequest", "AccountRequest", "BackfillJob", "BlobRef", "Capability",
    "ConfigField", "CredsReply", "FetchSourceJob",
    "ImportGearJob", "ImportMetricsJob", "JOB_MODELS", "ManifestRecord", "NeedsReauthRequest",
    "OAuthExchangeError", "OAuthExchangeRequest", "OAuthMeta", "OkReply", "ParseBlobJob",
    "PresenceRecord", "PresignDownloadReply", "PresignDownloadRequest", "PresignUploadReply",
    "PresignUploadRequest", "ProviderMeta", "ReconcileJob", "TokenReply", "TokenStoreRequest", "parse_job",
    "parse_version", "parser_refusal",
]
