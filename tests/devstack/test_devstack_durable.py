"""The chaos harness's infrastructure restarts keep what production keeps: Redis with its AOF and
nats-server with JetStream on disk come back on the same address with their data (real servers)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import redis

from devstack.infra import services


def test_a_redis_restart_in_place_keeps_the_data_and_the_address(tmp_path: Path) -> None:
    svc = services.start_redis(tmp_path / "redis", appendonly=True)
    try:
        client = redis.Redis.from_url(svc.url)
        client.rpush("celery", b"a task message")
        client.close()
        svc = services.restart(svc, graceful=True, down_s=0.2)
        client = redis.Redis.from_url(svc.url)
        assert client.lrange("celery", 0, -1) == [b"a task message"]
        client.close()
    finally:
        svc.stop()


def test_a_nats_restart_in_place_keeps_the_stream(tmp_path: Path) -> None:
    svc = services.start_nats(tmp_path / "nats")

    async def publish(url: str) -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        await js.add_stream(name="JOBS", subjects=["jobs.>"])
        await js.publish("jobs.one", b"a job")
        await nc.close()

    async def count(url: str) -> int:
        nc = await nats.connect(url)
        info = await nc.jetstream().stream_info("JOBS")
        await nc.close()
        return info.state.messages

    try:
        asyncio.run(publish(svc.url))
        svc = services.restart(svc, graceful=True, down_s=0.2)
        assert asyncio.run(count(svc.url)) == 1
    finally:
        svc.stop()
