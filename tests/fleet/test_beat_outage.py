"""Beat's scheduler (``tasks/hardening/scheduler.py``): Redis failing while a due entry is advanced is an
outage of the tick, not a send error, and the entry still runs once Redis takes writes again."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from tasks.hardening.scheduler import ResilientRedBeatScheduler
from tests.kit.waiting import wait_until

ENTRY = "outage-probe"
QUEUE = "beat-outage-probe"
EVERY_S = 0.2  # the entry is due this often: due again by the time the test ticks
DUE_TIMEOUT_S = 5.0


@pytest.fixture()
def scheduler(fresh_redis: str) -> Iterator[ResilientRedBeatScheduler]:
    app = Celery("beat-outage", broker=fresh_redis, set_as_current=False)
    app.conf.update(redbeat_redis_url=fresh_redis, redbeat_lock_key=None, task_default_queue=QUEUE,
                    beat_schedule={ENTRY: {"task": "probe.noop", "schedule": EVERY_S}})
    sched = ResilientRedBeatScheduler(app=app)
    yield sched
    redis.Redis.from_url(fresh_redis).config_set("min-replicas-to-write", 0)
    sched.close()


def _due(sched: ResilientRedBeatScheduler) -> bool:
    return any(entry.is_due()[0] for entry in sched.schedule.values())


def test_redis_refusing_the_entrys_advance_is_an_outage_and_the_entry_runs_after(
        fresh_redis: str, scheduler: ResilientRedBeatScheduler, caplog: pytest.LogCaptureFixture) -> None:
    r = redis.Redis.from_url(fresh_redis)
    wait_until(lambda: _due(scheduler), DUE_TIMEOUT_S, "the entry to be due")
    r.config_set("min-replicas-to-write", 1)  # reads are served, every write is refused (NOREPLICAS)
    with caplog.at_level(logging.INFO, logger="celery.beat"):
        scheduler.tick()
    assert "Message Error" not in caplog.text and "Traceback" not in caplog.text, caplog.text
    assert [rec.levelname for rec in caplog.records if "Redis" in rec.getMessage()] == ["WARNING"], caplog.text
    assert r.llen(QUEUE) == 0  # nothing sent while the entry could not be advanced
    r.config_set("min-replicas-to-write", 0)
    wait_until(lambda: _due(scheduler), DUE_TIMEOUT_S, "the entry to be due")
    scheduler.tick()
    assert r.llen(QUEUE) == 1  # sent once Redis takes writes again
