"""Pydantic models for the Voicy Worker API (reference/voicy.md §1), and its failure redaction."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from workers.errors import PermanentJobError
from workers.logs import redact

Bucket = Literal["oldest", "newest"]
ENGINE_NAME = "faster-whisper"
MAX_TEXT_CHARS = 100_000  # server limit for text, in UTF-16 units (§1.9, §1.10)
MAX_PARTS = 5000  # server limit for parts
MAX_ERROR_CHARS = 2000  # the server cuts lastError to this many UTF-16 units (§1.11)
UNKNOWN_ERROR = "Unknown worker error"

# Voicy's redactSensitiveText (src/helpers/report.ts), in its order. JavaScript
# ``^``/``$`` without the m flag anchor the whole string: ``\A``/``\Z`` here.
_VOICY_REDACTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(/(?:file/)?bot)\d+:[A-Za-z0-9_-]+(?=/|\?|\Z)", re.A), r"\1[redacted-telegram-token]"),
    (re.compile(r"\b\d{5,}:[A-Za-z0-9_-]{20,}\b", re.A), "[redacted-telegram-token]"),
    (re.compile(r"\b(?:Bearer|Token|Authorization|Api-Key)\s+[^,\s)]+", re.I), "[redacted-secret]"),
    (re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]+", re.A), "[redacted-stripe-key]"),
    (re.compile(r"\bwhsec_[A-Za-z0-9]+", re.A), "[redacted-stripe-secret]"),
    (re.compile(r"(mongodb(?:\+srv)?://[^:\s/@]+:)[^@\s]+(@)", re.I), r"\1[redacted-password]\2"),
    (re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/\s@]+:)[^@\s/]+(@)", re.I), r"\1[redacted-password]\2"),
    (re.compile(r"([?&](?:token|key|secret|password|signature|api_hash)=)[^&\s]+", re.I), r"\1[redacted]"),
    (re.compile(r"(\A|[\s(\[\"'])(/(?:Users|home|tmp|var|private|Volumes)/[^\s,)\"']+)"),
     r"\1[redacted-local-path]"),
    (re.compile(r"(\A|[\s(\[\"'])([A-Za-z]:\\[^\s,)\"']+)"), r"\1[redacted-local-path]"),
)


def redact_sensitive_text(text: str) -> str:
    """Voicy's failure-message redaction, then our registered secrets (tokens we loaded)."""
    for pattern, repl in _VOICY_REDACTIONS:
        text = pattern.sub(repl, text)
    return redact(text)


def utf16_len(text: str) -> int:
    """JavaScript ``.length``: the server's limits count UTF-16 code units."""
    return len(text.encode("utf-16-le")) // 2


def cut_utf16(text: str, limit: int) -> str:
    """At most ``limit`` UTF-16 units, never splitting a surrogate pair."""
    if utf16_len(text) <= limit:
        return text
    return text.encode("utf-16-le")[: limit * 2].decode("utf-16-le", errors="ignore")


class _Wire(BaseModel):
    """Dumped without ``None``: the server answers ``null`` with a 400 while an omitted field keeps
    the stored value (§1.0). Unknown keys are ignored: a job has ~30 and a newer server may add more."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    def body(self) -> dict[str, Any]:
        """The JSON body: camelCase names, ``None`` omitted (never ``null``)."""
        return self.model_dump(by_alias=True, exclude_none=True)


class _Media(_Wire):
    """The media fields a job and its ``/source`` answer share (§1.0, §1.7)."""

    file_id: str | None = Field(default=None, alias="fileId")
    file_unique_id: str | None = Field(default=None, alias="fileUniqueId")
    file_path: str | None = Field(default=None, alias="filePath")
    local_source_path: str | None = Field(default=None, alias="localSourcePath")
    file_size: int | None = Field(default=None, alias="fileSize")
    mime_type: str | None = Field(default=None, alias="mimeType")
    file_name: str | None = Field(default=None, alias="fileName")
    source_kind: str | None = Field(default=None, alias="sourceKind")
    source_url: str | None = Field(default=None, alias="sourceUrl")


class Job(_Media):
    """``serializeJob`` (§1.0). Only fields a worker can use are typed; the rest are ignored."""

    id: str
    status: str
    attempts: int = 0
    chat_id: str | None = Field(default=None, alias="chatId")
    telegram_chat_id: str | None = Field(default=None, alias="telegramChatId")
    telegram_chat_type: str | None = Field(default=None, alias="telegramChatType")
    source_message_id: int | None = Field(default=None, alias="sourceMessageId")
    recognition_language_hint: str | None = Field(default=None, alias="recognitionLanguageHint")
    claimed_at: str | None = Field(default=None, alias="claimedAt")
    downloaded_at: str | None = Field(default=None, alias="downloadedAt")
    heartbeat_at: str | None = Field(default=None, alias="heartbeatAt")
    created_at: str | None = Field(default=None, alias="createdAt")


class JobResponse(_Wire):
    """Every 200 job answer: ``{"job": {...}}``."""

    job: Job


class Source(_Media):
    """``GET /jobs/:id/source`` (§1.7); token-bearing ``sourceUrl`` values never arrive."""

    job_id: str = Field(alias="jobId")


class SourceResponse(_Wire):
    source: Source


class ClaimBody(_Wire):
    """claim-download and claim-ready: only the exact string ``newest`` selects newest (§1.0)."""

    bucket: Bucket = "oldest"


class DownloadedBody(_Wire):
    local_source_path: str = Field(alias="localSourcePath", min_length=1)


class Part(_Wire):
    time_code: str = Field(alias="timeCode")  # "MM:SS"
    text: str


class EngineMetadata(_Wire):
    model: str
    device: str
    compute_type: str = Field(alias="computeType")


class TranscriptBody(_Wire):
    """The body of both ``progress`` and ``result``; ``text`` may be ``""`` (§1.10, §8.1)."""

    text: str
    parts: list[Part] | None = None
    language: str | None = None
    engine: str | None = ENGINE_NAME
    duration: float | None = Field(default=None, ge=0)
    metadata: EngineMetadata | None = None

    def check_uploadable(self) -> None:
        """Voicy's client-side size guard (§6.7): non-retryable, with Voicy's exact messages."""
        chars = utf16_len(self.text)
        if chars > MAX_TEXT_CHARS:
            raise PermanentJobError("Transcription result text is too large to upload safely; "
                                    f"textChars={chars}; maxTextChars={MAX_TEXT_CHARS}")
        if self.parts is not None and len(self.parts) > MAX_PARTS:
            raise PermanentJobError("Transcription result has too many parts to upload safely; "
                                    f"parts={len(self.parts)}; maxParts={MAX_PARTS}")


class FailureBody(_Wire):
    """``POST /jobs/:id/failure``; ``error`` is redacted and cut as it is built.

    Voicy's ``redactSensitiveText`` rules (§6.9) and our registered secrets, cut to the server's
    2000 UTF-16 units: an unredacted failure text cannot be built at all.
    """

    error: str
    retryable: bool

    @field_validator("error")
    @classmethod
    def _safe(cls, value: str) -> str:
        return cut_utf16(redact_sensitive_text(value), MAX_ERROR_CHARS) or UNKNOWN_ERROR
