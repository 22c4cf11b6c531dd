"""Where a model runs and with how many CPU threads: the only GPU-aware code of the engines."""

from __future__ import annotations

import os

import ctranslate2

from workers.transcribe.engine import SINGLE_PROCESS_POOL
from workers.transcribe.settings import AUTO_CPU_THREADS, AUTO_DEVICE, CUDA_DEVICE

# The GPU-only paths are exactly three, all here: the device choice, the float16 compute type and
# CTranslate2's own thread default on CUDA. Everything else, the batched engine included, is the same
# code on both (batching short recordings by default depends on the device's name only:
# ``EngineSettings.clip_batch_on``).
CPU_DEVICE = "cpu"
CUDA_COMPUTE_TYPE = "float16"
CPU_COMPUTE_TYPE = "int8"
CTRANSLATE2_DEFAULT_THREADS = 0  # what WhisperModel(cpu_threads=0) hands CTranslate2: its own default


def pick_device(requested: str) -> str:
    """``auto`` → ``cuda`` when a CUDA device is visible to CTranslate2, else ``cpu``."""
    if requested != AUTO_DEVICE:
        return requested
    return CUDA_DEVICE if ctranslate2.get_cuda_device_count() > 0 else CPU_DEVICE


def default_compute_type(device: str) -> str:
    return CUDA_COMPUTE_TYPE if device == CUDA_DEVICE else CPU_COMPUTE_TYPE


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. a container's cpuset), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS): every core the OS reports
        return max(1, os.cpu_count() or 1)


def resolve_cpu_threads(requested: int, device: str, pool_processes: int, cores: int) -> int:
    """The ``cpu_threads`` to load the model with.

    An explicit value is passed through. Auto on CUDA: CTranslate2's default
    (CPU threads barely matter there). Auto on CPU: the cores split evenly
    between the pool's processes, at least one thread each, so processes ×
    threads matches the cores instead of every process running CTranslate2's
    default of 4: intra-op threading of a small model scales poorly, and
    one-thread processes side by side do more work. ``pool_processes`` is the
    Celery worker's, handed over by ``tasks.voicy`` before it forks
    (``workers.transcribe.engine.set_pool_processes``); outside a prefork
    pool it is one.
    """
    if requested != AUTO_CPU_THREADS:
        return requested
    if device == CUDA_DEVICE:
        return CTRANSLATE2_DEFAULT_THREADS
    return max(1, cores // max(SINGLE_PROCESS_POOL, pool_processes))


def threads_reason(requested: int, device: str, cores: int, pool_processes: int) -> str:
    """Why the model got its thread count, for the load log line."""
    if requested != AUTO_CPU_THREADS:
        return "VOICY_WORKER_CPU_THREADS"
    if device == CUDA_DEVICE:
        return "auto on cuda: CTranslate2's default"
    return f"auto: {cores} usable cores / {pool_processes} pool processes"
