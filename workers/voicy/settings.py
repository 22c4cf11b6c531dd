"""Voicy-side settings, with the same ``VOICY_WORKER_*`` names as Voicy's own worker client.

Numbers follow the client's rule (reference/voicy.md §6.1): unset or empty
means the default, anything negative is a configuration error naming the
variable. ``VOICY_WORKER_PROGRESS_INTERVAL_MS`` below 1000 is clamped to 1000,
matching the server's own clamp of its edit interval.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from workers.config import load_settings
from workers.logs import register_secret

DEFAULT_TELEGRAM_API_URL = "https://api.telegram.org"
DEFAULT_MODEL = "large-v3"
MIN_PROGRESS_INTERVAL_MS = 1000
CLOUD_BOT_API_MAX_BYTES = 20 * 1024 * 1024  # the cloud Bot API refuses larger downloads


class VoicySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VOICY_WORKER_", extra="ignore", populate_by_name=True,
                                      env_ignore_empty=True)

    api_url: str
    token: SecretStr
    work_dir: Path = Field(default_factory=lambda: Path.cwd() / "tmp" / "voicy-worker")
    media_store: str | None = None
    poll_interval_ms: float = Field(default=1000, ge=0)
    heartbeat_interval_ms: float = Field(default=30000, ge=0)
    download_timeout_ms: float = Field(default=300000, ge=0)
    download_concurrency: int = Field(default=2, ge=0)
    transcription_concurrency: int = Field(default=1, ge=0)
    ready_queue_limit: int | None = Field(default=None, ge=0)
    stale_active_job_ms: float = Field(default=900000, ge=0)
    lease_ttl_ms: float = Field(default=30000, ge=100)
    telegram_api_url: str = DEFAULT_TELEGRAM_API_URL
    telegram_bot_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("VOICY_WORKER_TELEGRAM_BOT_TOKEN", "TOKEN"))
    max_media_bytes: int = Field(default=CLOUD_BOT_API_MAX_BYTES, ge=1)
    language: str | None = None
    engine: str = "faster-whisper"
    model: str = Field(default=DEFAULT_MODEL, validation_alias=AliasChoices(
        "VOICY_WORKER_MODEL", "VOICY_WHISPER_MODEL"))
    device: str = Field(default="auto", pattern="^(auto|cuda|cpu)$")
    compute_type: str | None = None
    beam_size: int = Field(default=5, ge=1)
    progress_interval_ms: float = Field(default=2500, ge=0)

    @field_validator("api_url", "telegram_api_url")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return value

    @field_validator("progress_interval_ms")
    @classmethod
    def _clamp_progress(cls, value: float) -> float:
        return max(MIN_PROGRESS_INTERVAL_MS, value)

    @model_validator(mode="after")
    def _derive(self) -> VoicySettings:
        self.download_concurrency = max(1, self.download_concurrency)
        self.transcription_concurrency = max(1, self.transcription_concurrency)
        if self.ready_queue_limit is None:
            self.ready_queue_limit = max(self.download_concurrency, 2 * self.transcription_concurrency)
        self.ready_queue_limit = max(1, self.ready_queue_limit)
        if not self.media_store:
            self.media_store = str(self.work_dir)
        mb = os.environ.get("VOICY_MAX_MEDIA_FILE_SIZE_MB", "").strip()
        if mb and "VOICY_WORKER_MAX_MEDIA_BYTES" not in os.environ:
            self.max_media_bytes = int(float(mb) * 1024 * 1024)
        return self

    @property
    def timeout_s(self) -> float:
        return self.download_timeout_ms / 1000.0


def load_voicy_settings(**overrides: object) -> VoicySettings:
    """Load from the environment (``ConfigError`` names a bad variable) and register secrets."""
    settings = load_settings(VoicySettings, **overrides)
    register_secret(settings.token.get_secret_value())
    if settings.telegram_bot_token is not None:
        bot = settings.telegram_bot_token.get_secret_value()
        register_secret(bot)
        register_secret(bot.split(":", 1)[-1])
    return settings
