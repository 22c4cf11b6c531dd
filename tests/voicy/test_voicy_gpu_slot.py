"""A downloaded job holds its gpu capacity before Voicy calls it ``ready`` (issue 15 §2, the per-job costs).

The bridge runs ``claim-ready`` whenever the fleet's gpu load is under its
capacity, to recover this worker's ready jobs after a restart. When the
download posted ``/downloaded`` first and only then put the job on the gpu
set, a bridge pass in between found a free slot, claimed the job's own ready
state back from Voicy ("already being handled by this fleet") and made the
transcription's ``/transcribe`` answer 404 and cost a ``GET /jobs/:id``: two
wasted calls seen on most jobs of an idle fleet by ``python -m bench voicy-costs``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from devstack.fakes.http_server import BackgroundServer
from devstack.fakes.telegram import FakeTelegram
from devstack.fakes.voicy_api import DevVoicyServer
from devstack.fakes.voicy_api.app import build_app
from devstack.infra.stack import BOT_TOKEN, fleet_env
from tests.kit.voicy_stack import claim_without_sending, enqueue_fixture, fleet_runtime, requests_for, short_item
from workers.voicy import pipeline
from workers.voicy.fleet import GPU_KEY

pytestmark = pytest.mark.slow


class GpuLoadWatchingServer(DevVoicyServer):
    """The dev Voicy API, noting whether each job is on the fleet's gpu set when its ``/downloaded`` arrives."""

    def __init__(self, redis_url: str) -> None:
        super().__init__()
        self.redis = redis.Redis.from_url(redis_url)
        self.on_gpu_at_downloaded: dict[str, bool] = {}

    def start(self) -> GpuLoadWatchingServer:
        app = build_app(self.state)

        async def watch(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"].endswith("/downloaded"):
                job_id = scope["path"].rstrip("/").split("/")[-2]
                self.on_gpu_at_downloaded[job_id] = self.redis.zscore(GPU_KEY, job_id) is not None
            await app(scope, receive, send)

        self.http = BackgroundServer(watch, "dev-voicy", self.port).start()
        return self


@pytest.fixture()
def stack(tmp_path: Path, fresh_redis: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, ...]]:
    server = GpuLoadWatchingServer(fresh_redis).start()
    telegram = FakeTelegram(BOT_TOKEN).start()
    try:
        env = fleet_env(redis_url=fresh_redis, api_url=server.url, token=server.create_client("gpu-slot"),
                        telegram_url=telegram.url, work_dir=tmp_path / "work")
        with fleet_runtime(env, monkeypatch) as rt:
            yield server, telegram, rt
    finally:
        telegram.stop()
        server.stop()
        server.redis.close()


def test_a_job_is_on_the_gpu_set_before_voicy_hears_it_is_downloaded(stack: tuple[Any, ...]) -> None:
    server, telegram, rt = stack
    enqueue_fixture(server, telegram, short_item())
    job_id, token = claim_without_sending(rt)
    assert pipeline.run_download(rt, job_id, token)
    assert server.on_gpu_at_downloaded == {job_id: True}
    assert server.get_job(job_id)["status"] == "ready" and rt.fleet.gpu_load() == 1
    assert len(requests_for(server, job_id, "downloaded")) == 1
