"""The fleet with ``VOICY_WORKER_BATCH_SIZE=8``: the gpu pool runs the batched engine, Voicy sees the same label.

Real Redis, the dev Voicy API, fake Telegram, real io/gpu Celery workers and
the bridge, as in test_voicy_e2e; only the environment differs. Engine-level
parity and progress streaming are in tests/engine/test_engine_batched.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.infra.stack import audio_manifest, start_bridge
from tests.kit.celery_worker import CeleryWorker
from tests.kit.voicy_stack import enqueue_fixture, requests_for, voicy_dev_stack, wait_final
from workers.transcribe.registry import BATCHED_ENGINE

pytestmark = pytest.mark.slow

BATCH_SIZE = "8"


@pytest.fixture()
def voicy(tmp_path: Path, fresh_redis: str) -> Iterator[tuple[Any, Any, dict[str, str]]]:
    """A dev Voicy API, a fake Telegram, and the fleet environment."""
    with voicy_dev_stack(tmp_path, fresh_redis, "batched") as stack:
        yield stack


def test_batch_size_selects_the_batched_engine_and_the_label_stays(
        voicy: tuple[Any, Any, dict[str, str]], celery_workers: Callable[..., CeleryWorker], tmp_path: Path) -> None:
    server, telegram, env = voicy
    env = dict(env, VOICY_WORKER_BATCH_SIZE=BATCH_SIZE)
    items = sorted(audio_manifest(), key=lambda m: m["duration_s"])[-2:]  # the longest: the story, 35.6 s
    celery_workers("io", env)
    gpu = celery_workers("gpu", env)
    bridge = start_bridge(env, tmp_path / "bridge.log")
    try:
        ids = {enqueue_fixture(server, telegram, item): item for item in items}
        jobs = wait_final(server, list(ids))
    finally:
        bridge.stop()
    for job_id, item in ids.items():
        job = jobs[job_id]
        assert job["status"] == "completed", (item["name"], job.get("lastError"), bridge.log()[-2000:])
        text = job["resultText"].lower()
        for word in item["keywords"]:
            assert word.lower() in text, (item["name"], word, text)
        assert job["resultParts"] and all(p["timeCode"] for p in job["resultParts"])
        assert job["workerEngine"] == "faster-whisper"  # VOICY_WORKER_ENGINE's default: a label, unchanged
        assert job["workerEngineMetadata"]["computeType"] == "int8"
        assert [r["status"] for r in requests_for(server, job_id, "result")] == [200]
    assert f"engine {BATCHED_ENGINE}" in gpu.log()
