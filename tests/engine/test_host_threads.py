"""A CUDA engine's host thread pools: the decision, and that it reaches libgomp before CTranslate2 loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.infra.stack import TINY_MODEL_DIR
from workers.transcribe.host_threads import (
    CUDA_HOST_THREADS,
    OMP_THREADS_ENV,
    HostThreads,
    decide,
    nvidia_gpu_listed,
    prepare,
)

ROOT = Path(__file__).resolve().parents[2]
ONE = str(CUDA_HOST_THREADS)


def test_cuda_gets_one_host_thread() -> None:
    chosen = decide("cuda", {}, gpu_listed=False)
    assert chosen.env == {OMP_THREADS_ENV: ONE}
    assert "device=cuda" in chosen.describe("cuda")


def test_auto_follows_the_driver_listing() -> None:
    assert decide("auto", {}, gpu_listed=True).env == {OMP_THREADS_ENV: ONE}
    assert decide("auto", {}, gpu_listed=False).env == {}


def test_cpu_keeps_every_default() -> None:
    chosen = decide("cpu", {}, gpu_listed=True)
    assert chosen.env == {}
    assert chosen.describe("cpu") == "host threads unchanged (cpu: the libraries' defaults)"


def test_an_operator_value_is_kept() -> None:
    chosen = decide("cuda", {OMP_THREADS_ENV: "4"}, gpu_listed=True)
    assert chosen.env == {}
    assert "OMP_NUM_THREADS=4 set by the operator" in chosen.describe("cuda")


def test_too_late_once_a_pool_library_is_loaded() -> None:
    chosen = decide("cuda", {}, gpu_listed=True, loaded={"numpy": None})
    assert chosen.env == {}
    assert "numpy already loaded" in chosen.reason


def test_a_cuda_guess_that_ends_on_cpu_says_so() -> None:
    chosen = HostThreads({OMP_THREADS_ENV: ONE}, "device=auto and the NVIDIA driver lists a GPU")
    assert "the model runs on cpu" in chosen.describe("cpu")


def test_prepare_sets_the_given_environment() -> None:
    env: dict[str, str] = {}
    prepare("cuda", env, loaded=())
    assert env == {OMP_THREADS_ENV: ONE}
    env = {}
    prepare("cpu", env, loaded=())
    assert env == {}
    env = {}
    prepare("cuda", env, loaded=("numpy",))  # this test process may have numpy already: then too late
    assert env == {}


def test_driver_listing(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus"
    assert not nvidia_gpu_listed({}, gpus)  # no driver
    gpus.mkdir()
    assert not nvidia_gpu_listed({}, gpus)  # a driver without GPUs
    (gpus / "0000:01:00.0").mkdir()
    assert nvidia_gpu_listed({}, gpus)
    assert not nvidia_gpu_listed({"CUDA_VISIBLE_DEVICES": "-1"}, gpus)
    assert not nvidia_gpu_listed({"CUDA_VISIBLE_DEVICES": ""}, gpus)
    assert nvidia_gpu_listed({"CUDA_VISIBLE_DEVICES": "0"}, gpus)


# A fresh interpreter, as a gpu pool child: records OMP_NUM_THREADS at the moment ctranslate2 and numpy
# are first imported, validates the settings (VOICY_WORKER_LANGUAGE too, as the Celery parent does),
# builds the engine (on this box a CUDA model fails to load, after CTranslate2 loaded), then asks the
# bundled libgomp how many threads a parallel region started now would get.
PROBE = r"""
import glob, importlib.abc, json, os, sys
seen = {}
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("ctranslate2", "numpy") and name not in seen:
            seen[name] = os.environ.get("OMP_NUM_THREADS")
        return None
sys.meta_path.insert(0, Watch())
from workers.errors import ConfigError
from workers.transcribe.engine import create_engine
from workers.transcribe.settings import load_engine_settings
settings = load_engine_settings()
after_settings = sorted(m for m in ("ctranslate2", "numpy", "faster_whisper") if m in sys.modules)
try:
    create_engine(settings)
except ConfigError:
    pass
import ctypes, ctranslate2
libs = os.path.join(os.path.dirname(os.path.dirname(ctranslate2.__file__)), "ctranslate2.libs")
gomp = ctypes.CDLL(glob.glob(os.path.join(libs, "libgomp*"))[0])
print(json.dumps({"seen": seen, "after_settings": after_settings, "omp_max_threads": gomp.omp_get_max_threads()}))
"""


def _probe(device: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != OMP_THREADS_ENV and not k.startswith("VOICY_WORKER_")}
    env.update({"VOICY_WORKER_DEVICE": device, "VOICY_WORKER_MODEL": TINY_MODEL_DIR, "VOICY_WORKER_LANGUAGE": "en",
                "PYTHONPATH": str(ROOT)}, **extra)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.model
def test_a_cuda_pool_child_sets_the_threads_before_ctranslate2_loads() -> None:
    found = _probe("cuda")
    assert found["after_settings"] == []  # checking the language loaded neither library
    assert found["seen"] == {"ctranslate2": ONE, "numpy": ONE}
    assert found["omp_max_threads"] == CUDA_HOST_THREADS  # libgomp read it


@pytest.mark.model
def test_a_cpu_child_and_an_operator_value_are_left_alone() -> None:
    cpu = _probe("cpu")
    assert cpu["seen"] == {"ctranslate2": None, "numpy": None}
    assert cpu["omp_max_threads"] == len(os.sched_getaffinity(0))  # libgomp's own default
    operator = _probe("cuda", OMP_NUM_THREADS="3")
    assert operator["seen"] == {"ctranslate2": "3", "numpy": "3"}
    assert operator["omp_max_threads"] == 3
