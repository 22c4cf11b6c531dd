"""Pydantic models for the Voicy Worker API (reference/voicy.md §1).

Requests are dumped with ``exclude_none``: the server treats JSON ``null`` as a
400 while an omitted field keeps the stored value (§1.0), so we never send null.
Responses ignore unknown keys: the real job object has about 30 of them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    def body(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class Job(_Wire):
    id: str
    status: str
    attempts: int = 0
    file_id: str | None = Field(default=None, alias="fileId")
    file_path: str | None = Field(default=None, alias="filePath")
    local_source_path: str | None = Field(default=None, alias="localSourcePath")
    mime_type: str | None = Field(default=None, alias="mimeType")
    file_name: str | None = Field(default=None, alias="fileName")
    source_kind: str | None = Field(default=None, alias="sourceKind")
    recognition_language_hint: str | None = Field(default=None, alias="recognitionLanguageHint")


class Source(_Wire):
    job_id: str = Field(alias="jobId")
    file_id: str | None = Field(default=None, alias="fileId")
    file_path: str | None = Field(default=None, alias="filePath")
    file_size: int | None = Field(default=None, alias="fileSize")
    mime_type: str | None = Field(default=None, alias="mimeType")
    file_name: str | None = Field(default=None, alias="fileName")
    source_kind: str | None = Field(default=None, alias="sourceKind")
    source_url: str | None = Field(default=None, alias="sourceUrl")
    local_source_path: str | None = Field(default=None, alias="localSourcePath")


class Part(_Wire):
    time_code: str = Field(alias="timeCode")
    text: str


class EngineMetadata(_Wire):
    model: str
    device: str
    compute_type: str = Field(alias="computeType")


class TranscriptBody(_Wire):
    """The body of both ``progress`` and ``result``."""

    text: str
    parts: list[Part] | None = None
    language: str | None = None
    engine: str | None = "faster-whisper"
    duration: float | None = None
    metadata: EngineMetadata | None = None


class FailureBody(_Wire):
    error: str
    retryable: bool
