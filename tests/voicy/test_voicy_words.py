"""The fleet gives the words faster-whisper gives directly with the same model, options and threads.

Issue 15 §2: a transcript that went through the bridge, the io and gpu
workers, the media store and Voicy's API must hold the same words as the
fleet's engine called in this process on the same file, with the default
settings and the thread count the fleet's one gpu process runs with; and, for
a recording of one window, as ``WhisperModel.transcribe`` itself with the
sequential engine's options (``workers.transcribe.whisper.decode_options``).
Compared as normalised words (``bench.words``), never punctuation.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from faster_whisper import WhisperModel

from bench.words import normalise
from devstack.infra.stack import AUDIO_DIR, TINY_MODEL_DIR, audio_manifest, start_bridge
from tests.kit.celery_worker import CeleryWorker
from tests.kit.voicy_stack import SUITE_CPU_THREADS, voicy_dev_stack
from tests.kit.waiting import wait_until
from workers.transcribe.batched import ONE_WINDOW_S
from workers.transcribe.engine import create_engine
from workers.transcribe.settings import DEFAULT_BEAM_SIZE, EngineSettings
from workers.transcribe.whisper import decode_options

pytestmark = pytest.mark.slow

JOB_DONE_TIMEOUT_S = 240.0
GPU_PROCESSES = 1  # the Procfile's gpu line
NAMES = ("story", "weather", "train")  # two windows, and two one-window messages


def test_the_fleet_transcribes_the_words_direct_faster_whisper_gives(
        tmp_path: Path, fresh_redis: str, celery_workers: Callable[..., CeleryWorker]) -> None:
    items = [m for m in audio_manifest() if m["name"] in NAMES]
    with voicy_dev_stack(tmp_path, fresh_redis, "words") as (server, telegram, env):
        celery_workers("io", env, concurrency=2)
        celery_workers("gpu", env, concurrency=GPU_PROCESSES)
        bridge = start_bridge(env, tmp_path / "bridge.log")
        try:
            ids = {}
            for item in items:
                data = (AUDIO_DIR / item["file"]).read_bytes()
                telegram.add_file(f"fid-{item['name']}", data)
                ids[server.enqueue_job(f"fid-{item['name']}", file_size=len(data), mime_type="audio/ogg")] = item
            wait_until(lambda: all(server.get_job(j)["status"] in ("completed", "failed") for j in ids),
                       JOB_DONE_TIMEOUT_S, "the jobs to end", interval_s=0.2)
        finally:
            bridge.stop()
        fleet = {item["name"]: server.get_job(job_id) for job_id, item in ids.items()}
    threads = SUITE_CPU_THREADS  # the fleet's gpu process ran with these (tests/kit/voicy_stack.py)
    engine = create_engine(EngineSettings(model=TINY_MODEL_DIR, device="cpu", cpu_threads=threads))
    model = WhisperModel(TINY_MODEL_DIR, device="cpu", compute_type="int8", cpu_threads=threads,
                         local_files_only=True)
    for item in items:
        job = fleet[item["name"]]
        assert job["status"] == "completed", job.get("lastError")
        path = AUDIO_DIR / item["file"]
        direct = engine.transcribe(path).text
        assert normalise(job["resultText"]) == normalise(direct), (item["name"], job["resultText"], direct)
        if item["duration_s"] <= ONE_WINDOW_S:
            segments, _ = model.transcribe(str(path), **decode_options(DEFAULT_BEAM_SIZE))
            assert normalise(job["resultText"]) == normalise(" ".join(s.text for s in segments)), item["name"]
