"""Voicy-side settings, with the same ``VOICY_WORKER_*`` names as Voicy's own worker client."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, AliasChoices, BeforeValidator, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings

from workers.config import load_settings
from workers.errors import ConfigError
from workers.logs import register_secret
from workers.transcribe.settings import AUTO_DEVICE, ENGINE_SETTINGS_CONFIG, NO_CLIP_BATCHING, EngineSettings

DEFAULT_TELEGRAM_API_URL = "https://api.telegram.org"
DEFAULT_ENGINE = "faster-whisper"  # the workerEngine label (§6.1), whichever engine runs
DEFAULT_POLL_INTERVAL_MS = 1000.0
DEFAULT_HEARTBEAT_INTERVAL_MS = 30000.0
DEFAULT_DOWNLOAD_TIMEOUT_MS = 300000.0
DEFAULT_RESTART_DELAY_MS = 10000.0
DEFAULT_PROGRESS_INTERVAL_MS = 2500.0
MIN_PROGRESS_INTERVAL_MS = 1000.0  # the server clamps its visible-edit interval to this too
DEFAULT_STALE_ACTIVE_JOB_MS = 900000.0  # the server's claim-ready cutoff (15 min)
DEFAULT_LEASE_TTL_MS = 30000.0
MIN_LEASE_TTL_MS = 100.0
DEFAULT_DOWNLOAD_CONCURRENCY = 2.0  # downloads in flight
DEFAULT_TRANSCRIPTION_CONCURRENCY = 1.0  # gpu slots in the fleet
DEFAULT_CLIP_BATCH_WAIT_MS = 250.0  # the most a gpu slot waits for batch-mates that are on their way
# A confirmed grant whose task's message has been out of every queue this long is stranded: under early
# ack with prefetch disabled a delivered message is started within milliseconds (workers.voicy.grants).
DEFAULT_STRANDED_GRANT_MS = 60000.0
MIN_STRANDED_GRANT_MS = 1000.0
READY_PER_SLOT_WITHOUT_BATCHING = 2  # Voicy's default backlog: two per gpu slot
MIN_SLOTS = 1.0  # Voicy: max(1, v) for every slot count
CLOUD_BOT_API_MAX_BYTES = 20 * 1024 * 1024  # the cloud Bot API refuses larger downloads
BYTES_PER_MB = 1024 * 1024
SERVER_MAX_MEDIA_ENV = "VOICY_MAX_MEDIA_FILE_SIZE_MB"  # the server's variable, honoured as a fallback
TRUE_FLAGS = frozenset({"1", "true"})  # Voicy's IDLE_EXIT rule: only these two strings
NON_NEGATIVE_MESSAGE = "must be a non-negative number"
# Heroku sets DYNO on every dyno, and dynos share no disk: a directory media store there would
# fail every transcription ("downloaded media is missing from the media store"), so it is refused.
HEROKU_DYNO_ENV = "DYNO"
S3_STORE_PREFIX = "s3://"

# What JavaScript's Number() accepts from a string, after trimming (ECMAScript StringNumericLiteral).
_JS_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_JS_INTEGER = re.compile(r"0(?:[xX](?P<hex>[0-9a-fA-F]+)|[oO](?P<oct>[0-7]+)|[bB](?P<bin>[01]+))")
_JS_RADIX = {"hex": 16, "oct": 8, "bin": 2}
_JS_INFINITY = re.compile(r"[+-]?Infinity")


def js_number(text: str) -> float:
    """JavaScript's ``Number(text)``: what Voicy's client does with a numeric variable.

    Decimal and exponent forms and ``0x``/``0o``/``0b`` integers parse; blank
    is 0; ``Infinity`` is infinite; anything else (``30s``, ``1_000``, ``nan``)
    is NaN. Python's ``float()`` differs on several of these, hence our own.
    """
    s = text.strip()
    if not s:
        return 0.0
    if _JS_DECIMAL.fullmatch(s):
        return float(s)
    if _JS_INFINITY.fullmatch(s):
        return -math.inf if s.startswith("-") else math.inf
    integer = _JS_INTEGER.fullmatch(s)
    if integer is not None:
        kind, digits = next((k, v) for k, v in integer.groupdict().items() if v is not None)
        return float(int(digits, _JS_RADIX[kind]))
    return math.nan


def _non_negative(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(NON_NEGATIVE_MESSAGE)
    return value


def _number(value: object) -> object:
    """Strings (the environment) go through ``Number()``; values passed in code are left to pydantic."""
    return js_number(value) if isinstance(value, str) else value


def number_env(name: str) -> float | None:
    """A numeric variable that is not a settings field, read by name with the same rule.

    ``None`` when unset or empty. Not a field because a field is also read under
    our prefix plus its own name (``populate_by_name``), which would make an
    undocumented ``VOICY_WORKER_MAX_MEDIA_FILE_SIZE_MB`` work; and reading it
    here lets the ``ConfigError`` name it exactly.
    """
    raw = os.environ.get(name, "")
    if not raw:
        return None
    try:
        return _non_negative(js_number(raw))
    except ValueError:
        raise ConfigError(f"invalid configuration: {name}: {NON_NEGATIVE_MESSAGE}") from None


def whole_slots(value: float) -> int:
    """A slot count as Voicy's client uses it: ``max(1, v)``, and ``running < v`` admits ``ceil(v)`` (2.5 → 3)."""
    return math.ceil(max(MIN_SLOTS, value))


NonNegative = Annotated[float, BeforeValidator(_number), AfterValidator(_non_negative)]
NonNegativeInt = Annotated[int, AfterValidator(_non_negative)]
# A slot count: parsed like every number, a whole number (int) once the settings are built.
SlotCount = NonNegative

_PREFIXED = ENGINE_SETTINGS_CONFIG  # the same VOICY_WORKER_ prefix and rules as the engine's own settings


class VoicyTimings(BaseSettings):
    """The two periods beat's schedule is built from, validated exactly as the fleet validates them.

    Separate because ``tasks.beat`` builds the schedule at ``import tasks`` in every
    Celery process: it must be able to check these two without requiring
    ``VOICY_WORKER_API_URL``/``TOKEN`` (``VoicySettings`` inherits them).
    """

    model_config = _PREFIXED

    heartbeat_interval_ms: NonNegative = DEFAULT_HEARTBEAT_INTERVAL_MS  # 0 disables
    lease_ttl_ms: NonNegative = DEFAULT_LEASE_TTL_MS

    @field_validator("lease_ttl_ms")
    @classmethod
    def _lease_floor(cls, value: float) -> float:
        if value < MIN_LEASE_TTL_MS:
            raise ValueError(f"must be at least {MIN_LEASE_TTL_MS:g}")
        return value

    @property
    def heartbeat_interval_s(self) -> float | None:
        """``None`` when heartbeats are disabled (``HEARTBEAT_INTERVAL_MS=0``)."""
        return self.heartbeat_interval_ms / 1000.0 if self.heartbeat_interval_ms > 0 else None

    @property
    def lease_ttl_s(self) -> float:
        return self.lease_ttl_ms / 1000.0


class VoicySettings(VoicyTimings, EngineSettings):
    """Everything the Voicy side reads from the environment (``VOICY_WORKER_*``), its engine's too.

    The names are Voicy's client's, so an operator moves its environment over unchanged
    (reference/voicy.md §6.1); only the aliases §6.1 lists are read, never a bare field name such
    as ``MODEL``, which pydantic-settings would match case-insensitively against unrelated
    variables. The engine's variables are :class:`EngineSettings`', inherited so one read of the
    environment validates both. Numbers follow the client's rule (:func:`js_number`): unset or
    empty is the default, a non-finite or negative result is a ``ConfigError``.
    """

    api_url: str
    token: SecretStr
    work_dir: Path = Field(default_factory=lambda: Path.cwd() / "tmp" / "voicy-worker")
    # a directory or s3://bucket/prefix; default: work_dir (checked even when unset: see _shared_on_heroku)
    media_store: str | None = Field(default=None, validate_default=True)
    poll_interval_ms: NonNegative = DEFAULT_POLL_INTERVAL_MS  # Voicy: 5000; we claim only with capacity
    download_timeout_ms: NonNegative = DEFAULT_DOWNLOAD_TIMEOUT_MS
    restart_delay_ms: NonNegative = DEFAULT_RESTART_DELAY_MS
    download_concurrency: SlotCount = DEFAULT_DOWNLOAD_CONCURRENCY
    transcription_concurrency: SlotCount = DEFAULT_TRANSCRIPTION_CONCURRENCY
    ready_queue_limit: SlotCount | None = None  # default: Voicy's, or a whole clip batch per gpu slot (_derive)
    idle_exit: bool = False
    stale_active_job_ms: NonNegative = DEFAULT_STALE_ACTIVE_JOB_MS
    telegram_api_url: str = DEFAULT_TELEGRAM_API_URL
    telegram_bot_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("VOICY_WORKER_TELEGRAM_BOT_TOKEN", "TOKEN"))
    max_media_bytes: NonNegativeInt | None = None  # ours (Voicy streams unbounded, §6.4)
    engine: str = DEFAULT_ENGINE  # ENGINE: only the workerEngine label sent with results (§6.7), selects nothing
    progress_interval_ms: NonNegative = DEFAULT_PROGRESS_INTERVAL_MS  # ours; clamped like the server's edits (§4)
    clip_batch_wait_ms: NonNegative = DEFAULT_CLIP_BATCH_WAIT_MS  # ours
    stranded_grant_ms: NonNegative = DEFAULT_STRANDED_GRANT_MS  # ours (workers.voicy.grants)

    @field_validator("api_url", "telegram_api_url")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return value

    @field_validator("media_store")
    @classmethod
    def _shared_on_heroku(cls, value: str | None) -> str | None:
        """On Heroku io and gpu are separate dynos with no shared disk: only S3 can carry the media."""
        if os.environ.get(HEROKU_DYNO_ENV) and not (value or "").startswith(S3_STORE_PREFIX):
            raise ValueError(f"must be an {S3_STORE_PREFIX}bucket/prefix URL on Heroku "
                             f"({HEROKU_DYNO_ENV} is set): dynos share no disk")
        return value

    @field_validator("idle_exit", mode="before")
    @classmethod
    def _flag(cls, value: object) -> bool:
        return value if isinstance(value, bool) else str(value).strip().lower() in TRUE_FLAGS

    @field_validator("progress_interval_ms")
    @classmethod
    def _clamp_progress(cls, value: float) -> float:
        return max(MIN_PROGRESS_INTERVAL_MS, value)

    @field_validator("stranded_grant_ms")
    @classmethod
    def _stranded_floor(cls, value: float) -> float:
        if value < MIN_STRANDED_GRANT_MS:  # shorter would mistake a delivery being started for a lost one
            raise ValueError(f"must be at least {MIN_STRANDED_GRANT_MS:g}")
        return value

    @field_validator("max_media_bytes")
    @classmethod
    def _positive_bound(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError("must be at least 1")
        return value

    @model_validator(mode="after")
    def _derive(self) -> VoicySettings:
        # Voicy derives the ready-queue default from max(1, v) of the unrounded values; only its
        # `running < v` comparisons make whole numbers of them, so rounding up comes last.
        download = max(MIN_SLOTS, self.download_concurrency)
        transcription = max(MIN_SLOTS, self.transcription_concurrency)
        ready = self.ready_queue_limit
        if ready is None:
            clips = self._clip_batch()
            per_slot = clips + 1 if clips > NO_CLIP_BATCHING else READY_PER_SLOT_WITHOUT_BATCHING
            ready = max(download, per_slot * transcription)
        self.download_concurrency = whole_slots(download)
        self.transcription_concurrency = whole_slots(transcription)
        self.ready_queue_limit = whole_slots(ready)
        if not self.media_store:
            self.media_store = str(self.work_dir)
        if self.max_media_bytes is None:
            mb = number_env(SERVER_MAX_MEDIA_ENV)
            self.max_media_bytes = int(mb * BYTES_PER_MB) if mb else CLOUD_BOT_API_MAX_BYTES
        return self

    def _clip_batch(self) -> int:
        """The clip batch the gpu workers will run, as this process can tell (for the backlog default)."""
        if self.clip_batch_size is not None or self.device != AUTO_DEVICE:
            return self.clip_batch_on(self.device)
        # Function-level on purpose: ctranslate2 (~200 ms) loads only to look for a GPU, and only when
        # neither VOICY_WORKER_CLIP_BATCH_SIZE nor VOICY_WORKER_DEVICE says what the gpu hosts run.
        from workers.transcribe.device import pick_device

        return self.clip_batch_on(pick_device(AUTO_DEVICE))

    # --- derived values, in the units the code uses ----------------------------------------
    @property
    def timeout_s(self) -> float:
        """Voicy uses the download timeout for every API call and getFile too (§6.1)."""
        return self.download_timeout_ms / 1000.0

    @property
    def poll_interval_s(self) -> float:
        return self.poll_interval_ms / 1000.0

    @property
    def progress_interval_s(self) -> float:
        return self.progress_interval_ms / 1000.0

    @property
    def clip_batch_wait_s(self) -> float:
        return self.clip_batch_wait_ms / 1000.0

    @property
    def stranded_grant_s(self) -> float:
        return self.stranded_grant_ms / 1000.0


def load_voicy_settings(**overrides: object) -> VoicySettings:
    """Load from the environment (``ConfigError`` names a bad variable) and register secrets.

    The bot token is registered whole and by its secret half (after ``<bot id>:``),
    because a URL or message could carry either.
    """
    number_env(SERVER_MAX_MEDIA_ENV)  # named even when VOICY_WORKER_MAX_MEDIA_BYTES makes it unused
    settings = load_settings(VoicySettings, **overrides)
    register_secret(settings.token.get_secret_value())
    if settings.telegram_bot_token is not None:
        bot = settings.telegram_bot_token.get_secret_value()
        register_secret(bot)
        register_secret(bot.split(":", 1)[-1])
    return settings
