"""The process's engine: built from the registry by name, once per process, after fork."""

from __future__ import annotations

import importlib
import threading

from workers.transcribe import host_threads
from workers.transcribe.protocol import TranscriptionEngine
from workers.transcribe.registry import engine_target
from workers.transcribe.settings import EngineSettings

SINGLE_PROCESS_POOL = 1  # not in a prefork pool (tests, benchmarks, solo/threads pools)

_pool_processes = SINGLE_PROCESS_POOL
_engine: TranscriptionEngine | None = None
_lock = threading.Lock()


def set_pool_processes(processes: int) -> None:
    """How many pool processes of this worker share the host's cores (called before the fork)."""
    global _pool_processes
    _pool_processes = max(SINGLE_PROCESS_POOL, int(processes))


def engine_class(name: str) -> type[TranscriptionEngine]:
    """The class registered as ``name``, its module imported now (``KeyError`` if unregistered)."""
    module_name, _, attr = engine_target(name).partition(":")
    return getattr(importlib.import_module(module_name), attr)


def create_engine(settings: EngineSettings, pool_processes: int = SINGLE_PROCESS_POOL) -> TranscriptionEngine:
    """A new engine of the kind ``settings`` select, its model loaded (``ConfigError`` if it cannot be).

    The host thread pools are sized first (``host_threads.prepare``): importing
    the engine's module loads CTranslate2 and numpy, which read their size then.
    """
    host_threads.prepare(settings.device)
    return engine_class(settings.engine_name)(settings, pool_processes)  # type: ignore[call-arg]


def get_engine(settings: EngineSettings) -> TranscriptionEngine:
    """The process's engine, built on first use (after fork) and kept.

    Why once per process and after fork: loading large-v3 takes seconds and
    gigabytes, GPU memory is not fully returned when a model is dropped
    (reference/ecosystem.md §4.2), and CUDA contexts do not survive fork. So
    it is built lazily inside the pool child on its first job, never at
    import or in the parent. Importing this module imports no engine: the
    registry names engines as strings. Which engine:
    ``EngineSettings.engine_name``.
    """
    global _engine
    with _lock:
        if _engine is None:
            _engine = create_engine(settings, _pool_processes)
        return _engine


def reset_engine() -> None:
    """Drop the cached engine (tests; a process that must switch models should restart instead)."""
    global _engine
    with _lock:
        _engine = None
