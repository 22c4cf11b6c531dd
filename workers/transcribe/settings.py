"""The engine's own settings, read from the ``VOICY_WORKER_*`` names operators already use."""

from __future__ import annotations

from pydantic import AliasChoices, Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from workers.config import load_settings
from workers.transcribe.languages import normalize, whisper_languages
from workers.transcribe.registry import BATCHED_ENGINE, SEQUENTIAL_ENGINE, engine_names

DEFAULT_MODEL = "large-v3"
AUTO_DEVICE = "auto"
CUDA_DEVICE = "cuda"
DEFAULT_DEVICE = AUTO_DEVICE
DEFAULT_BEAM_SIZE = 5
AUTO_CPU_THREADS = 0  # CPU_THREADS=0: the engine sizes its threads to the host (workers.transcribe.device)
SEQUENTIAL_BATCH_SIZE = 0  # BATCH_SIZE=0: no batching, the sequential engine
DEFAULT_BATCH_SIZE = 8  # BATCH_SIZE unset: the batched engine, 8 windows per pass (faster-whisper's default)
AUTO_CLIP_BATCH = None  # CLIP_BATCH_SIZE unset: by device (EngineSettings.clip_batch_on)
NO_CLIP_BATCHING = 1  # CLIP_BATCH_SIZE at or below this: every recording on its own
# Short recordings per batched pass when CLIP_BATCH_SIZE is unset. On an H200 a pass without timestamp
# tokens cost the same per clip at 16 as at 48, so a bigger batch only makes each voice wait for a
# longer pass (docs/BENCHMARKS.md "Clip batches").
CUDA_CLIP_BATCH = 16
# A CPU spends the same CPU time on a batch as on its clips one by one (docs/BENCHMARKS.md "Clip
# batches"), so there batching would only make each voice wait for the pass.
CPU_CLIP_BATCH = NO_CLIP_BATCHING
# Whether the batched engine's passes over a long recording decode timestamp tokens, when
# TIMESTAMP_TOKENS is unset. On a GPU a batched pass with them grows with the square of the batch
# (reference/gpu.md), so there each window is one part timed by its speech; on a CPU the pass stays
# linear and the parts keep Whisper's own sentence timing (docs/BENCHMARKS.md "Transcription engines").
CUDA_TIMESTAMP_TOKENS = False
CPU_TIMESTAMP_TOKENS = True

ENGINE_ENV_PREFIX = "VOICY_WORKER_"
ENGINE_SETTINGS_CONFIG = SettingsConfigDict(env_prefix=ENGINE_ENV_PREFIX, extra="ignore", populate_by_name=True,
                                            env_ignore_empty=True)


class EngineSettings(BaseSettings):
    """Everything an engine reads from the environment. Field order matters: ``transcriber``
    is validated before ``batch_size``, which is checked against it.

    Why its own class: an engine needs the model, where to run it and how, and nothing about
    Voicy's API, Telegram or the media store, so ``workers.transcribe`` never imports
    ``workers.voicy`` and a bench loads it alone (:func:`load_engine_settings`).
    ``workers.voicy.settings.VoicySettings`` extends it, so a bad engine variable still stops
    the bridge and the workers at start, naming it. The names are Voicy's client's
    (reference/voicy.md §6.1: ``VOICY_WORKER_MODEL``, falling back to ``VOICY_WHISPER_MODEL``,
    and ``VOICY_WORKER_LANGUAGE``) plus ours, each the field name under ``VOICY_WORKER_``;
    never a bare ``MODEL``. ``VOICY_WORKER_ENGINE`` is not read here: it is the label Voicy
    stores as ``workerEngine`` (``VoicySettings.engine``).
    """

    model_config = ENGINE_SETTINGS_CONFIG

    model: str = Field(default=DEFAULT_MODEL, validation_alias=AliasChoices(
        "VOICY_WORKER_MODEL", "VOICY_WHISPER_MODEL"))  # a name (large-v3) or a local CTranslate2 dir
    device: str = Field(default=DEFAULT_DEVICE, pattern="^(auto|cuda|cpu)$")
    compute_type: str | None = None  # default chosen by the engine: float16 on CUDA, int8 on CPU
    cpu_threads: int = Field(default=AUTO_CPU_THREADS, ge=0)  # intra-op threads per gpu-pool process
    beam_size: int = Field(default=DEFAULT_BEAM_SIZE, ge=1)
    language: str | None = None  # the fallback recognition language (after the job's hint)
    transcriber: str | None = None  # a registry name; unset: chosen by batch_size
    batch_size: int | None = Field(default=None, ge=0)  # windows decoded at once; 0: sequential; unset: default
    clip_batch_size: int | None = Field(default=AUTO_CLIP_BATCH, ge=0)  # short recordings per pass; ≤ 1: off
    timestamp_tokens: bool | None = None  # batched windows of a long recording; unset: by device

    @field_validator("language")
    @classmethod
    def _known_language(cls, value: str | None) -> str | None:
        """A code faster-whisper knows: Voicy passes it on unchecked, but here a typo would fail
        every job on a multilingual model, so it stops start-up instead."""
        if value is None or not value.strip():
            return None
        code = normalize(value)
        if code not in whisper_languages():
            raise ValueError("must be a language code faster-whisper knows, e.g. en, de, ru, uk")
        return code

    @field_validator("transcriber")
    @classmethod
    def _registered(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        name = value.strip()
        known = engine_names()
        if name not in known:
            raise ValueError(f"must be one of {', '.join(known)}")
        return name

    @field_validator("batch_size")
    @classmethod
    def _batch_matches_engine(cls, value: int | None, info: ValidationInfo) -> int | None:
        named = info.data.get("transcriber")
        if value is None:
            return None
        if named == SEQUENTIAL_ENGINE and value > SEQUENTIAL_BATCH_SIZE:
            raise ValueError(f"must be 0 with VOICY_WORKER_TRANSCRIBER={SEQUENTIAL_ENGINE}, which does not batch")
        if named == BATCHED_ENGINE and value == SEQUENTIAL_BATCH_SIZE:
            raise ValueError(f"must be at least 1 with VOICY_WORKER_TRANSCRIBER={BATCHED_ENGINE}")
        return value

    @property
    def engine_name(self) -> str:
        """The registry name of the engine to run: the one named, else chosen by the batch size
        (unset or N > 0: ``faster-whisper-batched``; 0: ``faster-whisper``, the sequential one).
        The batched engine decodes a recording of one window exactly as the sequential one does,
        and a longer one in batches of VAD windows (docs/BENCHMARKS.md "Transcription engines")."""
        if self.transcriber:
            return self.transcriber
        return SEQUENTIAL_ENGINE if self.batch_size == SEQUENTIAL_BATCH_SIZE else BATCHED_ENGINE

    @property
    def clip_batching(self) -> bool:
        """True when a gpu slot may transcribe several short recordings of separate jobs (each at most
        one window) in one pass: set above 1, or auto (the engine decides by its device: the io and
        bridge processes cannot know it)."""
        return self.clip_batch_size is AUTO_CLIP_BATCH or self.clip_batch_size > NO_CLIP_BATCHING

    def clip_batch_on(self, device: str) -> int:
        """Clips per batched pass on ``device`` (``cuda``/``cpu``, resolved): the configured number,
        else the device's default."""
        if self.clip_batch_size is not None:
            return self.clip_batch_size
        return CUDA_CLIP_BATCH if device == CUDA_DEVICE else CPU_CLIP_BATCH

    def timestamp_tokens_on(self, device: str) -> bool:
        """Whether the batched engine decodes timestamp tokens on ``device`` (resolved): the
        configured value, else the device's default."""
        if self.timestamp_tokens is not None:
            return self.timestamp_tokens
        return CUDA_TIMESTAMP_TOKENS if device == CUDA_DEVICE else CPU_TIMESTAMP_TOKENS

    @property
    def windows_per_pass(self) -> int:
        """The batched engine's batch: ``VOICY_WORKER_BATCH_SIZE``, or ``DEFAULT_BATCH_SIZE`` when unset."""
        return DEFAULT_BATCH_SIZE if self.batch_size is None else self.batch_size


def load_engine_settings(**overrides: object) -> EngineSettings:
    """From the environment; a bad value is a ``ConfigError`` naming its variable."""
    return load_settings(EngineSettings, **overrides)
