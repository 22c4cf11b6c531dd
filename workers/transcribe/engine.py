"""faster-whisper, one model per process, streaming segments as they are decoded.

Why one per process: loading large-v3 takes seconds and gigabytes, GPU memory
is not fully returned when a model is dropped (reference/ecosystem.md §4.2),
and CUDA contexts do not survive fork. So :func:`get_engine` loads the model
lazily inside the pool child on its first job — never at import, never in the
parent before fork — and keeps it for the life of the process.

Device: ``auto`` picks CUDA when CTranslate2 sees a GPU
(``ctranslate2.get_cuda_device_count() > 0``) and the CPU otherwise. The
GPU-only code is exactly that choice plus the ``float16`` default compute
type (CPU: ``int8``); everything else is the same on both.

Model: ``VOICY_WORKER_MODEL`` is a name (``large-v3``) or a local CTranslate2
directory. A directory is loaded with ``local_files_only=True`` (it must hold
``tokenizer.json`` or faster-whisper would fetch one); a name is too when
``HF_HUB_OFFLINE`` is set, so tests and air-gapped hosts never download.

CPU threads: faster-whisper's ``cpu_threads=0`` means CTranslate2's default of
4 intra-op threads whatever the host, and intra-op threading of a small model
scales poorly: on a 2-core host (tiny.en int8, 20 jobs) one process took
24.95 s with 4 threads and 26.0 s with 2, while two 1-thread processes side by
side took about 17 s (≈1.45× the throughput). So ``VOICY_WORKER_CPU_THREADS=0``
(auto) gives each process of the worker's pool an equal share of the cores the
process may run on: ``max(1, usable cores // pool processes)``. The pool size
is the Celery worker's, handed over by ``tasks.voicy`` in the parent before it
forks (:func:`set_pool_processes`; this package imports no Celery); a process
outside a prefork pool counts as a pool of one. On CUDA auto passes 0, since
CPU threads barely matter there. An explicit value is passed through.

Language: the job's hint, else ``VOICY_WORKER_LANGUAGE``, else detected
(Voicy's order, reference/voicy.md §6.7). A hint the model does not know
(``english``, ``xx``) is skipped in that order rather than failing the job:
faster-whisper's tokenizer raises ``ValueError`` for it on a multilingual
model, and that would be reported retryable and fail the same way three times
(``workers.transcribe.languages``). VAD is on (bundled Silero model, no
download) so silence is skipped.

Empty transcripts (silence, music) are a *normal result* with ``text: ""``:
Voicy's client has uploaded them so since commit 8920982, the server accepts
``""`` and answers "no text detected" (reference/voicy.md §8.1); a retry
would only transcribe the same silence again.

Errors: undecodable media (PyAV/FFmpeg errors) is permanent, and so is media
with no audio stream at all (a video-only MP4 sent as a ``video`` or
``document``): it is found by probing the container's streams before decoding,
because faster-whisper's ``decode_audio`` would fail with a bare
``IndexError`` that says nothing about the file. A missing file, running out
of memory and anything unexpected are retryable.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workers.errors import ConfigError, JobError, PermanentJobError, RetryableJobError
from workers.transcribe.languages import pick_language
from workers.voicy.models import EngineMetadata, Part, TranscriptBody
from workers.voicy.settings import AUTO_CPU_THREADS, VoicySettings

log = logging.getLogger(__name__)

CUDA_COMPUTE_TYPE = "float16"
CPU_COMPUTE_TYPE = "int8"
DURATION_DIGITS = 3  # seconds are reported to the millisecond
SECONDS_PER_MINUTE = 60
OFFLINE_ENVS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
CTRANSLATE2_DEFAULT_THREADS = 0  # what WhisperModel(cpu_threads=0) hands CTranslate2: its own default
SINGLE_PROCESS_POOL = 1  # not in a prefork pool (tests, benchmarks, solo/threads pools)

_pool_processes = SINGLE_PROCESS_POOL


def pick_device(requested: str) -> str:
    """``auto`` → ``cuda`` when a CUDA device is visible to CTranslate2, else ``cpu``."""
    if requested != "auto":
        return requested
    import ctranslate2

    return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"


def set_pool_processes(processes: int) -> None:
    """How many pool processes of this worker share the host's cores (called before the fork)."""
    global _pool_processes
    _pool_processes = max(SINGLE_PROCESS_POOL, int(processes))


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. a container's cpuset), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS): every core the OS reports
        return max(1, os.cpu_count() or 1)


def resolve_cpu_threads(requested: int, device: str, pool_processes: int, cores: int) -> int:
    """The ``cpu_threads`` to load the model with.

    An explicit value is passed through. Auto on CUDA: CTranslate2's default.
    Auto on CPU: the cores split evenly between the pool's processes, at least
    one thread each, so processes × threads matches the cores instead of
    every process running CTranslate2's default of 4.
    """
    if requested != AUTO_CPU_THREADS:
        return requested
    if device == "cuda":
        return CTRANSLATE2_DEFAULT_THREADS
    return max(1, cores // max(SINGLE_PROCESS_POOL, pool_processes))


def default_compute_type(device: str) -> str:
    return CUDA_COMPUTE_TYPE if device == "cuda" else CPU_COMPUTE_TYPE


def time_code(seconds: float) -> str:
    """``MM:SS`` of a segment start (minutes keep growing past 99)."""
    minutes, secs = divmod(max(0, int(seconds)), SECONDS_PER_MINUTE)
    return f"{minutes:02d}:{secs:02d}"


def _offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes") for name in OFFLINE_ENVS)


@dataclass
class Transcript:
    """The transcript so far (partial while streaming, final at the end)."""

    parts: list[Part] = field(default_factory=list)
    language: str | None = None
    duration: float | None = None

    @property
    def text(self) -> str:
        return " ".join(p.text for p in self.parts if p.text).strip()


class Engine:
    """A loaded model and the options it was loaded with."""

    def __init__(self, settings: VoicySettings, pool_processes: int = SINGLE_PROCESS_POOL) -> None:
        from faster_whisper import WhisperModel

        self.device = pick_device(settings.device)
        self.compute_type = settings.compute_type or default_compute_type(self.device)
        cores = usable_cores()
        self.cpu_threads = resolve_cpu_threads(settings.cpu_threads, self.device, pool_processes, cores)
        self.model_name = settings.model
        self.engine_name = settings.engine  # VOICY_WORKER_ENGINE: what Voicy stores as workerEngine (§6.7)
        self.default_language = settings.language
        self.beam_size = settings.beam_size
        local = Path(settings.model).expanduser().is_dir()
        try:
            self._model = WhisperModel(str(Path(settings.model).expanduser()) if local else settings.model,
                                       device=self.device, compute_type=self.compute_type,
                                       cpu_threads=self.cpu_threads, local_files_only=local or _offline())
        except Exception as exc:  # missing files, unsupported compute type, no CUDA runtime...
            raise ConfigError(f"VOICY_WORKER_MODEL={self.metadata.model} could not be loaded on "
                              f"{self.device} ({self.compute_type}): {type(exc).__name__}") from None
        if settings.cpu_threads != AUTO_CPU_THREADS:
            why = "VOICY_WORKER_CPU_THREADS"
        elif self.device == "cuda":
            why = "auto on cuda: CTranslate2's default"
        else:
            why = f"auto: {cores} usable cores / {pool_processes} pool processes"
        log.info("loaded model %s on %s (%s), cpu_threads=%d (%s)", self.metadata.model, self.device,
                 self.compute_type, self.cpu_threads, why)

    @property
    def metadata(self) -> EngineMetadata:
        """The model's *name* only: a local path would disclose the host's layout."""
        return EngineMetadata(model=Path(self.model_name).name, device=self.device,
                              compute_type=self.compute_type)

    def transcribe(self, path: Path, language: str | None = None,
                   on_segment: Callable[[Transcript], None] | None = None) -> Transcript:
        """Decode ``path``; call ``on_segment`` with the growing transcript after each segment.

        faster-whisper decodes the audio, runs VAD and language detection when
        ``transcribe`` is called, and decodes text lazily while the segment
        generator is iterated (in 30-second windows), so the callback sees the
        transcript grow in bursts. An exception raised by the callback (e.g. a
        lost lease) stops decoding and propagates unchanged.
        """
        try:
            require_audio_stream(path)
            segments, info = self._model.transcribe(
                str(path), language=self.language_for(language), vad_filter=True,
                beam_size=self.beam_size)
            transcript = Transcript(language=info.language, duration=round(info.duration, DURATION_DIGITS))
            iterator = iter(segments)
        except Exception as exc:
            raise _classify(exc) from None
        while True:
            try:
                segment = next(iterator)
            except StopIteration:
                break
            except Exception as exc:
                raise _classify(exc) from None
            text = segment.text.strip()
            if text:
                transcript.parts.append(Part(time_code=time_code(segment.start), text=text))
                if on_segment is not None:
                    on_segment(transcript)
        return transcript

    def language_for(self, hint: str | None) -> str | None:
        """The job's hint if this model knows it, else ``VOICY_WORKER_LANGUAGE``, else ``None`` (detect)."""
        return pick_language(hint, self.default_language, self._model.supported_languages)

    def body(self, transcript: Transcript) -> TranscriptBody:
        """The ``progress``/``result`` body; absent values are omitted when dumped.

        ``engine`` is the configured ``VOICY_WORKER_ENGINE`` (default ``faster-whisper``),
        as Voicy's client sends it, so an operator can tell fleets apart in ``workerEngine``.
        """
        return TranscriptBody(text=transcript.text, parts=list(transcript.parts),
                              language=transcript.language, engine=self.engine_name,
                              duration=transcript.duration, metadata=self.metadata)

    progress_body = body
    result_body = body


def require_audio_stream(path: Path) -> None:
    """Raise ``PermanentJobError`` unless the container at ``path`` has an audio stream.

    Opening the container twice costs milliseconds; decoding a file with no
    audio would fail deterministically on every retry. Errors opening it are
    left to :func:`_classify` (a missing file stays retryable).
    """
    import av

    with av.open(str(path), metadata_errors="ignore") as container:
        has_audio = bool(container.streams.audio)
    if not has_audio:
        raise PermanentJobError("media has no audio stream")


def _classify(exc: Exception) -> Exception:
    """Map a decoding/inference error to our tree; messages carry no path (PyAV quotes it)."""
    if isinstance(exc, JobError):  # already classified (require_audio_stream)
        return exc
    name = type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return RetryableJobError(f"media file is missing: {name}")
    if _is_av_error(exc):
        return PermanentJobError(f"media could not be decoded: {name}")
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        return RetryableJobError(f"transcription ran out of memory: {name}")
    return RetryableJobError(f"transcription failed: {name}")


def _is_av_error(exc: BaseException) -> bool:
    import av

    return isinstance(exc, av.error.FFmpegError)


_engine: Engine | None = None
_lock = threading.Lock()


def get_engine(settings: VoicySettings) -> Engine:
    """The process's engine, loaded on first use (after fork) and kept."""
    global _engine
    with _lock:
        if _engine is None:
            _engine = Engine(settings, _pool_processes)
        return _engine


def reset_engine() -> None:
    """Drop the cached engine (tests; a process that must switch models should restart instead)."""
    global _engine
    with _lock:
        _engine = None
