"""The chaos harness's infrastructure restarts keep what production keeps, and its Voicy count reads
the dev server's records the way RELIABILITY.md says.

Real services: redis-server with an AOF, nats-server with JetStream on disk,
the dev Voicy Worker API.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import nats
import redis
from bson import ObjectId

from bench.chaos_count import count_voicy
from bench.chaos_rig import VoicyJob
from deploy.devstack import durable, services
from deploy.devstack.voicy_api import DevVoicyServer


def test_a_redis_restart_in_place_keeps_the_data_and_the_address(tmp_path: Path) -> None:
    svc = durable.start_redis_aof(tmp_path / "redis")
    try:
        client = redis.Redis.from_url(svc.url)
        client.rpush("celery", b"a task message")
        client.close()
        svc = durable.restart_in_place(svc, 0.2, durable.start_redis_aof)
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
        svc = durable.restart_in_place(svc, 0.2, durable.start_nats_in)
        assert asyncio.run(count(svc.url)) == 1
    finally:
        svc.stop()


@dataclass
class _Rig:
    """What ``count_voicy`` reads of a rig: the dev server and the measured jobs."""

    voicy_api: DevVoicyServer
    voicy: list[VoicyJob] = field(default_factory=list)


def _job(server: DevVoicyServer, name: str, **fields: Any) -> VoicyJob:
    job_id = server.enqueue_job(name, file_size=10, mime_type="audio/ogg")
    if fields:
        server.update_job(job_id, fields)
    return VoicyJob(job_id, name, 5.0)


def test_voicy_jobs_are_counted_final_stuck_lost_or_inherent() -> None:
    with DevVoicyServer() as server:
        now = server.state.now()
        rig = _Rig(server)
        rig.voicy = [
            _job(server, "done", status="completed"),
            _job(server, "failed", status="failed", lastError="attempts exhausted"),
            _job(server, "held", status="transcribing", claimedAt=now, heartbeatAt=now),
            _job(server, "dropped", status="transcribing", claimedAt=now - timedelta(minutes=5),
                 heartbeatAt=now - timedelta(minutes=5)),
            _job(server, "orphan", status="downloading", claimedAt=now - timedelta(minutes=2),
                 heartbeatAt=now - timedelta(minutes=2), workerId=str(ObjectId())),
        ]
        out = count_voicy(rig)  # type: ignore[arg-type]
    ids = {j.file_id: j.job_id for j in rig.voicy}
    assert (out.jobs, out.final, out.completed) == (5, 2, 1)
    assert dict(out.failed) == {"attempts exhausted": 1}
    assert out.stuck == [f"{ids['held']}:transcribing"]
    assert sorted(out.lost) == sorted([f"{ids['dropped']}:transcribing", f"{ids['orphan']}:downloading"])
    assert out.inherent == [ids["orphan"]]
    assert out.duplicates == []
