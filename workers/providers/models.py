"""The data a provider takes and returns: job views, outcomes, discover and OAuth bodies."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from workers.providers.errors import ProviderRateLimited
from workers.providers.protos import worker_events


def _rfc3339(value: datetime) -> str:
    """UTC with a ``Z``: Go parses no timestamp without a zone (reference, encoding pitfalls)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class ProviderModel(BaseModel):
    """Boundary models: tolerant of extra fields from newer counterparts; secrets are ``repr=False``.

    The discover (§8) and OAuth exchange (§9b) bodies are what a provider returns *and* what
    goes on the wire, so they are defined once, here; ``workers/cairn`` serializes them.
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# --------------------------------------------------------------------------- job views


class FetchJob(Protocol):
    """The fields of a fetch_source / parse_blob job a provider reads."""

    user_id: str
    account_id: str
    ext_id: str
    fetch_streams: bool


class AccountJob(Protocol):
    """The fields of an account-level job (import_gear) a provider reads."""

    user_id: str
    account_id: str


class MetricsJob(AccountJob, Protocol):
    """An import_metrics job: the account and the period ``[since_unix, until_unix)``."""

    since_unix: int
    until_unix: int


class ActivityRef(ProviderModel):
    """One activity in a listing: the provider id and its start time."""

    ext_id: str
    start_time: datetime


# --------------------------------------------------------------------------- discover (§8)


class DiscoverRequest(ProviderModel):
    """Core's request. An empty ``account_id`` is refused by the discover handler."""

    account_id: str = ""
    start_page: int = 1

    @field_validator("start_page", mode="before")
    @classmethod
    def _at_least_one(cls, value: Any) -> int:
        return max(1, int(value or 1))


class DiscoverItem(ProviderModel):
    """One importable item; ``item_time`` is RFC 3339 (a datetime is rendered with ``Z``)."""

    item_type: str = "activity"
    external_id: str = Field(min_length=1)
    item_time: str | None = None

    @field_validator("item_time", mode="before")
    @classmethod
    def _time_text(cls, value: Any) -> Any:
        return _rfc3339(value) if isinstance(value, datetime) else (value or None)


class DiscoverReply(ProviderModel):
    """``items`` + ``next_page``, or ``complete``, or a ``rate_limited`` partial, or ``error``.

    ``to_wire`` follows the published Go worker: ``items`` and ``complete``
    always, ``next_page``, ``rate_limited`` and ``error`` only when set. A
    reply built with :meth:`failed` has no listing at all (``items`` None) and
    goes out as ``{"error": ...}`` alone: never an empty success when the
    cause was an error or a rate limit.
    """

    items: list[DiscoverItem] | None = Field(default_factory=list)
    complete: bool = False
    next_page: int | None = None
    rate_limited: bool | None = None
    error: str | None = None

    @classmethod
    def failed(cls, error: str) -> DiscoverReply:
        return cls(items=None, error=error)

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.items is not None:
            body["items"] = [i.model_dump(exclude_none=True) for i in self.items]
            body["complete"] = self.complete
        for key in ("next_page", "rate_limited", "error"):
            value = getattr(self, key)
            if value is not None:
                body[key] = value
        return body


# --------------------------------------------------------------------------- OAuth (§9b)


class OAuthTokens(ProviderModel):
    """A code exchange or refresh result; ``access_token``/``refresh_token`` are secrets.

    As the §9b exchange reply, ``provider_account_id`` (the provider's stable
    account id) must be set; a refresh may leave it empty.
    """

    access_token: str = Field(repr=False)
    refresh_token: str = Field(default="", repr=False)
    expires_at: datetime
    scope: str = ""
    token_type: str = "Bearer"
    provider_account_id: str = ""

    def to_wire(self) -> dict[str, Any]:
        body = self.model_dump(mode="json")
        body["expires_at"] = _rfc3339(self.expires_at)
        return body


# --------------------------------------------------------------------------- outcomes


@dataclasses.dataclass(frozen=True)
class RawArchive:
    """The raw inputs of one import, ready to upload as the dataset-N archive blob."""

    body: bytes
    dataset: int
    content_type: str = "application/json"

    @property
    def size_bytes(self) -> int:
        return len(self.body)


@dataclasses.dataclass
class FetchOutcome:
    """Result of fetch_source / parse_blob: events in dependency order plus the archive.

    ``wire_events`` are ``cairn.worker.v1.WorkerEvent`` messages as protojson
    dicts: GEAR events first, then the ACTIVITY they precede. ``events`` gives
    the same as proto messages (strictly parsed, so a field outside the
    contract fails here, not at core). ``archive`` is None for parse_blob (the
    blob already exists). ``gear_errors`` counts gear lookups that failed and
    were skipped (gear never fails an import); ``segment_errors`` and
    ``photo_errors`` count the same for segment details and mirrored photos.

    ``segment_events`` (SEGMENT events, then SEGMENT_EFFORT events) travel in a
    second result after the activity's, as the published worker sends them.
    ``rate_limited`` is set when the budget ran out part-way (the segment
    loop): publish what there is, then NAK the job until ``reset_at`` so the
    re-run completes it; waiting for a window is not a failure.
    """

    ext_id: str
    wire_events: list[dict[str, Any]]
    archive: RawArchive | None = None
    gear_errors: int = 0
    segment_events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    rate_limited: ProviderRateLimited | None = None
    segment_errors: int = 0
    photo_errors: int = 0

    @property
    def events(self) -> list[Any]:
        return worker_events(self.wire_events)

    @property
    def activity(self) -> dict[str, Any]:
        """The ``ImportedActivity`` dict of the (single) ACTIVITY event."""
        for event in self.wire_events:
            if "activity" in event:
                return event["activity"]
        raise LookupError("outcome carries no activity event")

    def attach_raw_blob(self, blob_id: str, *, size_bytes: int = 0, content_type: str = "") -> None:
        """Point the activity at its archived raw blob (after the caller uploaded it)."""
        activity = self.activity
        activity["rawBlobId"] = blob_id
        if size_bytes:
            activity["rawSizeBytes"] = str(size_bytes)
        if content_type:
            activity["rawContentType"] = content_type


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a provider declares: job kinds it consumes and presence data types.

    ``jobs`` drives which durable consumers the bridge creates (contract §3:
    import_gear/import_metrics only when the data really exists).
    ``data_types`` is the presence ``capabilities`` map (DataType → flags).
    """

    jobs: frozenset[str]
    data_types: Mapping[str, Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class PoolIdentity:
    """The pool a provider instance serves: what its raw archives' provenance names (contract §5)."""

    worker_name: str = ""
    package: str = ""

    @classmethod
    def of(cls, settings: Any) -> PoolIdentity:
        """The pool ``settings`` describe (a ``CairnSettings``); None or a provider's own settings name none."""
        return cls(str(getattr(settings, "worker_name", "") or ""), str(getattr(settings, "worker_package", "") or ""))


NO_POOL = PoolIdentity()  # a provider built outside a pool (a test, a parse-only tool): provenance names none
