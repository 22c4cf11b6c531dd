"""The bench's command line: every mode listed with what it measures, and ``bench gpu``'s lean import path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.__main__ import MODES

ROOT = Path(__file__).resolve().parents[2]
# What a GPU host without the fleet's services lacks: none may load on bench gpu's path.
FLEET_ONLY = ("celery", "kombu", "redis", "nats", "boto3", "botocore", "httpx", "deploy", "tasks", "bridges")


def _bench(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=True).stdout


def test_help_lists_every_mode_with_what_it_measures() -> None:
    out = _bench("--help")
    for mode in ("voicy", "voicy-costs", "voicy-rss", "voicy-burst", "words", "engine", "gpu", "cairn",
                 "capacity", "chaos", "partitions"):
        line = next((ln for ln in out.splitlines() if ln.split()[:1] == [mode]), None)
        assert line is not None, f"{mode} missing from --help"
        assert line.split(None, 1)[1] == MODES[mode]
    assert "--corpus" in _bench("gpu", "--help")


# bench gpu's whole import path on a carried corpus, as on a GPU host: the CLI, the corpus reader, the bench
# and the engines it builds, then what the engine modules import when a model loads.
LEAN = r"""
import json, sys
import bench.__main__, bench.gpu_corpus, bench.gpu, bench.gpu_targets, bench.gpu_carry
import workers.transcribe.batched, workers.transcribe.whisper, workers.transcribe.clips
import faster_whisper
print(json.dumps(sorted(sys.modules)))  # a package really imported is listed under its own name
"""


def test_bench_gpu_imports_nothing_of_the_fleet() -> None:
    out = subprocess.run([sys.executable, "-c", LEAN], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         check=True).stdout
    loaded = set(json.loads(out.strip().splitlines()[-1]))
    assert not loaded & set(FLEET_ONLY), sorted(loaded & set(FLEET_ONLY))
    assert {"ctranslate2", "faster_whisper", "jiwer", "pydantic_settings"} <= loaded
