"""The host thread pools of a CUDA engine's process, sized before the libraries that own them load."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from workers.transcribe.settings import AUTO_DEVICE, CUDA_DEVICE

# Read once, when the library that owns the pool loads: libgomp (bundled with CTranslate2, loaded by
# ``import ctranslate2``) and OpenBLAS (numpy's, loaded by ``import numpy``; it falls back to this
# name when OPENBLAS_NUM_THREADS is unset). Setting it later changes nothing for either.
OMP_THREADS_ENV = "OMP_NUM_THREADS"
# One host thread per pool for a CUDA engine: the model runs on the GPU, and the host's part
# (features, VAD, beam bookkeeping) is single-threaded work. With one thread per core instead,
# OpenBLAS's idle workers spin after every feature matmul and libgomp's after every parallel region,
# while the GPU works (docs/BENCHMARKS.md "GPU engine"). CTranslate2's own intra-op threads still
# follow VOICY_WORKER_CPU_THREADS: it sets them per worker thread (omp_set_num_threads).
CUDA_HOST_THREADS = 1
# Modules whose loading reads the variable: once one is loaded in this process, setting it is too late.
THREAD_POOL_MODULES = ("ctranslate2", "numpy")
NVIDIA_GPUS_DIR = Path("/proc/driver/nvidia/gpus")  # one entry per GPU the NVIDIA driver sees
CUDA_VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
NO_VISIBLE_GPU = ("", "-1", "none", "NoDevFiles")  # CUDA_VISIBLE_DEVICES values that hide every GPU


@dataclass(frozen=True)
class HostThreads:
    """What a process's host thread pools were given, and why (for the model-load log line)."""

    env: dict[str, str]  # variables set by this process (empty: none)
    reason: str

    def describe(self, device: str) -> str:
        """For the load line of a model that runs on ``device`` (resolved: ``cuda`` or ``cpu``)."""
        chosen = " ".join(f"{k}={v}" for k, v in self.env.items()) or "unchanged"
        if self.env and device != CUDA_DEVICE:  # auto saw a GPU that CTranslate2 cannot use
            return (f"host threads {chosen} (set for cuda, but the model runs on {device}: its threads are "
                    f"VOICY_WORKER_CPU_THREADS', numpy's BLAS has one)")
        return f"host threads {chosen} ({self.reason})"


def nvidia_gpu_listed(environ: Mapping[str, str], gpus_dir: Path = NVIDIA_GPUS_DIR) -> bool:
    """Whether the NVIDIA driver lists a GPU this process may see, read without loading CUDA or
    CTranslate2 (``device=auto`` decides by ``ctranslate2.get_cuda_device_count()``, which loads libgomp)."""
    visible = environ.get(CUDA_VISIBLE_ENV)
    if visible is not None and visible.strip() in NO_VISIBLE_GPU:
        return False
    try:
        return any(gpus_dir.iterdir())
    except OSError:
        return False


def decide(device: str, environ: Mapping[str, str], gpu_listed: bool, loaded: Iterable[str] = ()) -> HostThreads:
    """The host threads for an engine configured with ``device`` (``auto``/``cuda``/``cpu``).

    An ``OMP_NUM_THREADS`` the operator set is kept. A CPU engine (``cpu``, or
    ``auto`` with no GPU listed) keeps every library's default: its threads are
    ``VOICY_WORKER_CPU_THREADS``'s. A CUDA engine (``cuda``, or ``auto`` with a
    GPU listed) gets ``CUDA_HOST_THREADS``, unless a library that reads the
    variable is already ``loaded`` (then it is left alone and the reason says so).
    """
    if OMP_THREADS_ENV in environ:
        return HostThreads({}, f"{OMP_THREADS_ENV}={environ[OMP_THREADS_ENV]} set by the operator")
    cuda = device == CUDA_DEVICE or (device == AUTO_DEVICE and gpu_listed)
    if not cuda:
        return HostThreads({}, "cpu: the libraries' defaults")
    early = [name for name in THREAD_POOL_MODULES if name in loaded]
    if early:
        return HostThreads({}, f"cuda, but {', '.join(early)} already loaded: too late to size its threads")
    why = "device=cuda" if device == CUDA_DEVICE else "device=auto and the NVIDIA driver lists a GPU"
    return HostThreads({OMP_THREADS_ENV: str(CUDA_HOST_THREADS)}, f"{why}: no idle host threads spinning")


_applied: HostThreads | None = None


def prepare(device: str, environ: MutableMapping[str, str] | None = None,
            loaded: Iterable[str] | None = None) -> HostThreads:
    """Decide for ``device`` and set the variables in this process's environment; call it before the
    engine's module is imported (``workers.transcribe.engine.create_engine`` does). For the process's
    own environment the first call's outcome stands: the libraries read the variable once.
    ``loaded``: the modules already imported (default: this process's)."""
    global _applied
    own = environ is None
    if own and _applied is not None:
        return _applied
    env = os.environ if environ is None else environ
    chosen = decide(device, env, nvidia_gpu_listed(env), loaded=sys.modules if loaded is None else loaded)
    env.update(chosen.env)
    if own:
        _applied = chosen
    return chosen


def applied() -> HostThreads:
    """What :func:`prepare` chose in this process (``prepare`` never ran: nothing was set)."""
    return _applied or HostThreads({}, "not prepared: the libraries' defaults")
