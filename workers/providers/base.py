"""The provider interface: what the Cairn bridge and tasks may ask of any provider.

Why an interface: the bridge and the task functions must serve Strava today and
Garmin tomorrow without changing. Everything provider-specific (HTTP API,
usage headers, sport tables, the archive format) lives in one sub-package of
``workers/providers/`` behind :class:`Provider`; the contract-specific parts
(NATS, claim-check, token RPCs, the shared rate-limit KV) stay in
``workers/cairn`` and reach a provider only through :class:`ProviderContext`.

Errors are classes, not messages: a task maps ``ProviderRateLimited`` to a NAK
with a delay anchored to the real window, ``ProviderNotFound`` and
``ProviderPermanentError`` to failure envelope + Term, ``ProviderAuthError`` to
needs-reauth, and ``ProviderTransientError`` to a plain NAK. Every error
carries the contract's ``code`` and worker ``ErrorClass`` name so the caller can
build a ``WorkerError`` without knowing the provider. Messages never carry
tokens or client secrets.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

import httpx
from pydantic import BaseModel, ConfigDict, Field

from workers.errors import AuthError, PermanentJobError, RetryableJobError
from workers.logs import register_secret

# Job kinds of contract §3 (the last token before <provider>.<worker_name>).
FETCH_SOURCE = "fetch_source"
RECONCILE = "reconcile"
PARSE_BLOB = "parse_blob"
IMPORT_GEAR = "import_gear"
IMPORT_METRICS = "import_metrics"
BACKFILL = "backfill"
JOB_KINDS = (FETCH_SOURCE, RECONCILE, PARSE_BLOB, IMPORT_GEAR, IMPORT_METRICS, BACKFILL)

MIN_RATE_LIMIT_DELAY_S = 1.0  # a NAK delay below this is a hot loop in disguise


# --------------------------------------------------------------------------- errors


class ProviderError(Exception):
    """Mixin carrying the contract's failure ``code`` and worker ``ErrorClass`` name."""

    code: str = "provider_error"
    error_class: str = "ERROR_CLASS_TRANSIENT"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code:
            self.code = code


class ProviderTransientError(ProviderError, RetryableJobError):
    """Network failure, timeout, 5xx: NAK and let JetStream redeliver."""

    code = "transient"
    error_class = "ERROR_CLASS_TRANSIENT"


class ProviderPermanentError(ProviderError, PermanentJobError):
    """Unmappable data or a request the provider will always refuse: envelope + Term."""

    code = "invalid_input"
    error_class = "ERROR_CLASS_INVALID_INPUT"


class ProviderNotFound(ProviderError, PermanentJobError):
    """The entity is gone upstream (deleted activity): envelope ``not_found``."""

    code = "not_found"
    error_class = "ERROR_CLASS_NOT_FOUND"


class ProviderAuthError(ProviderError, PermanentJobError, AuthError):
    """The provider rejected the token or app credentials; the user must re-connect."""

    code = "needs_reauth"
    error_class = "ERROR_CLASS_AUTH_EXPIRED"


class ProviderRateLimited(ProviderError, RetryableJobError):
    """The provider's (or our shared) budget is spent until ``reset_at``.

    ``reset_at`` is the real window boundary (not "now + a guess"), so the NAK
    delay and the shared limiter both wake up when the provider does.
    ``window`` names the exhausted window (``short``, ``daily``, ``webhook``).
    """

    code = "rate_limited"
    error_class = "ERROR_CLASS_RATE_LIMITED"

    def __init__(self, reset_at: datetime, window: str, *, grace_s: float = 0.0,
                 message: str | None = None) -> None:
        self.reset_at = reset_at.astimezone(UTC)
        self.window = window
        self.grace_s = grace_s
        super().__init__(message or f"rate limited: {window} window resets at "
                         f"{self.reset_at.isoformat().replace('+00:00', 'Z')}")

    def delay_s(self, now: datetime | None = None) -> float:
        """Seconds to NAK for: until the reset plus grace, never below one second."""
        now = now or datetime.now(UTC)
        return max(MIN_RATE_LIMIT_DELAY_S, (self.reset_at - now).total_seconds() + self.grace_s)


# --------------------------------------------------------------------------- context


@dataclasses.dataclass(frozen=True)
class WindowUsage:
    """One provider rate-limit window as the provider reported it on a response."""

    window: str
    limit: int
    used: int
    reset_at: datetime

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)


@runtime_checkable
class RateLimitHook(Protocol):
    """The bridge to the shared budget (``cairn_rate_limits`` KV) without knowing NATS.

    ``reserve`` is called before every API request with the windows the call
    spends (e.g. ``("daily", "short")``) and raises :class:`ProviderRateLimited`
    when one is exhausted. ``observe`` is called after every response,
    including errors and 429s, with the usage the provider reported.
    """

    def reserve(self, windows: Sequence[str]) -> None: ...

    def observe(self, usage: Sequence[WindowUsage], headers: Mapping[str, str]) -> None: ...


class NullRateLimitHook:
    """No shared budget: every reservation succeeds, observations are dropped."""

    def reserve(self, windows: Sequence[str]) -> None:
        return None

    def observe(self, usage: Sequence[WindowUsage], headers: Mapping[str, str]) -> None:
        return None


@runtime_checkable
class BlobSink(Protocol):
    """Durable blob upload through core's presign (contract §5; the worker holds no S3 keys).

    ``upload`` stores ``body`` under the user's layout (``users/<user>/<provider>/…``)
    with its real content type and returns core's ``blob_id`` verbatim. Failures
    raise a ``RetryableJobError`` (presign or PUT refused); a caller that treats
    the blob as optional (a mirrored photo) skips it.
    """

    def upload(self, body: bytes, content_type: str, user_id: str) -> str: ...


@dataclasses.dataclass
class ProviderContext:
    """What a provider call may use: a token held in memory, an HTTP client, the budget.

    The access token is fetched fresh per job by the caller (contract §9) and
    lives only here; ``repr`` hides it and it is registered with the log
    redactor so it cannot leak through a log line or an exception text.
    ``bucket`` is the short-window bucket this job spends (``webhook`` jobs
    have their own).
    """

    access_token: str = dataclasses.field(repr=False)
    http: httpx.Client
    rate_limit: RateLimitHook = dataclasses.field(default_factory=NullRateLimitHook)
    bucket: str = "short"
    blobs: BlobSink | None = None  # mirrored media (photos); None: nothing is mirrored

    def __post_init__(self) -> None:
        register_secret(self.access_token)


# --------------------------------------------------------------------------- models


class ProviderModel(BaseModel):
    """Boundary models: tolerant of extra fields from newer counterparts."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


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


class ActivityRef(ProviderModel):
    """One activity in a listing: the provider id and its start time."""

    ext_id: str
    start_time: datetime


class DiscoverRequest(ProviderModel):
    account_id: str = ""
    start_page: int = 1


class DiscoverItem(ProviderModel):
    item_type: str = "activity"
    external_id: str
    item_time: str


class DiscoverReply(ProviderModel):
    """Contract §8 reply. ``to_wire`` drops unset optional keys like the Go worker."""

    items: list[DiscoverItem] = Field(default_factory=list)
    complete: bool = False
    next_page: int | None = None
    rate_limited: bool | None = None
    error: str | None = None

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"items": [i.model_dump() for i in self.items],
                                "complete": self.complete}
        for key in ("next_page", "rate_limited", "error"):
            value = getattr(self, key)
            if value is not None:
                body[key] = value
        return body


class OAuthTokens(ProviderModel):
    """Contract §9b success reply; ``access_token``/``refresh_token`` are secrets."""

    access_token: str = Field(repr=False)
    refresh_token: str = Field(default="", repr=False)
    expires_at: datetime
    scope: str = ""
    token_type: str = "Bearer"
    provider_account_id: str

    def to_wire(self) -> dict[str, Any]:
        body = self.model_dump(mode="json")
        body["expires_at"] = self.expires_at.astimezone(UTC).isoformat().replace("+00:00", "Z")
        return body


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


# --------------------------------------------------------------------------- protos

PB_PACKAGE = "workers.cairn.pb"
WORKER_EVENT = "cairn.worker.v1.WorkerEvent"


def proto_class(full_name: str) -> type[Any]:
    """The generated class of ``full_name`` (e.g. ``cairn.worker.v1.JobResult``).

    Looked up by proto name in the descriptor pool after importing every
    ``*_pb2`` module under ``workers.cairn.pb``, so providers do not depend on
    how the stubs are laid out on disk.
    """
    import importlib
    import pkgutil

    from google.protobuf import descriptor_pool, message_factory

    package = importlib.import_module(PB_PACKAGE)
    if not getattr(package, "_switchyard_loaded", False):
        for info in pkgutil.walk_packages(package.__path__, PB_PACKAGE + "."):
            if info.name.endswith("_pb2"):
                importlib.import_module(info.name)
        package._switchyard_loaded = True  # type: ignore[attr-defined]
    descriptor = descriptor_pool.Default().FindMessageTypeByName(full_name)
    return message_factory.GetMessageClass(descriptor)


def worker_events(wire_events: Sequence[Mapping[str, Any]]) -> list[Any]:
    """protojson ``WorkerEvent`` dicts → messages, strictly (unknown fields raise)."""
    from google.protobuf import json_format

    cls = proto_class(WORKER_EVENT)
    return [json_format.ParseDict(dict(event), cls(), ignore_unknown_fields=False)
            for event in wire_events]


# --------------------------------------------------------------------------- interface


class Provider(abc.ABC):
    """One provider API behind the contract's job kinds. Stateless between calls."""

    name: str
    dataset_version: int
    parser_version: str

    @abc.abstractmethod
    def declared_capabilities(self) -> Capabilities:
        """Job kinds and data types this provider really serves."""

    @abc.abstractmethod
    def manifest_meta(self) -> dict[str, Any] | None:
        """The manifest's ``provider_meta`` (None for parser-only pools)."""

    @abc.abstractmethod
    def new_http_client(self) -> httpx.Client:
        """An HTTP client configured for this provider (one per process, reused)."""

    @abc.abstractmethod
    def fetch_source(self, ctx: ProviderContext, job: FetchJob) -> FetchOutcome:
        """Fetch one activity (and streams) and map it; never fails on gear."""

    @abc.abstractmethod
    def parse_blob(self, raw: bytes, job: FetchJob) -> FetchOutcome:
        """Re-parse an archive: the same events the import produced, byte for byte."""

    @abc.abstractmethod
    def list_activities(self, ctx: ProviderContext, after: datetime | None,
                        before: datetime | None = None, limit: int | None = None,
                        exclude: Collection[str] = ()) -> list[ActivityRef]:
        """Activities started in ``[after, before)``; ``limit`` counts non-excluded ones."""

    @abc.abstractmethod
    def discover(self, ctx: ProviderContext, request: DiscoverRequest) -> DiscoverReply:
        """One discover round (contract §8); errors and rate limits are in the reply."""

    @abc.abstractmethod
    def exchange_oauth(self, http: httpx.Client, *, client_id: str, client_secret: str,
                       code: str, redirect_uri: str,
                       code_verifier: str | None = None) -> OAuthTokens:
        """Exchange an authorization code; the reply names the provider account id."""

    def import_gear(self, ctx: ProviderContext, job: AccountJob) -> list[dict[str, Any]]:
        """GEAR ``WorkerEvent`` dicts for every gear of the account, retired included.

        Only called when ``IMPORT_GEAR`` is declared; ``worker_events`` turns
        the dicts into messages.
        """
        raise NotImplementedError(f"{self.name} does not serve import_gear")
