"""Flower's ``/metrics`` gains the queue lengths (``tasks.queue_metrics``): read from a real Redis.

The collector runs here in the pytest process against the worker's own Redis; the Procfile's ``web``
line serving it is tests/fleet/test_procfile.py's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu import Connection
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from devstack.infra import services
from tasks.queue_metrics import BROKER_UP, QUEUE_MESSAGES, UNACKED_MESSAGES, QueueLengths
from tests.kit.queues import publish
from workers import liveness
from workers.logs import register_secret
from workers.redisconn import sync_client

PRIORITY = 9  # a message sent with a priority waits in another list than the queue's name (kombu's steps)
GET_TIMEOUT_S = 5.0


def scrape(collector: QueueLengths) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What ``/metrics`` would show of the collector: (name, labels) → value."""
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture()
def collector(fresh_redis: str) -> Iterator[QueueLengths]:
    c = QueueLengths(lambda: sync_client(fresh_redis))
    yield c
    c.close()


def test_each_fleet_queue_counts_every_priority_step_and_the_unacked(fresh_redis: str,
                                                                    collector: QueueLengths) -> None:
    client = redis.Redis.from_url(fresh_redis)
    try:
        liveness.renew(client, liveness.ProcessRecord(role=liveness.WORKER, name="strava-1",
                                                      queues=["provider.strava-fetcher"]))
        liveness.renew(client, liveness.ProcessRecord(role=liveness.CAIRN_BRIDGE, name="garmin-bridge-1",
                                                      pool="garmin-fetcher"))  # its workers are all down
        publish(fresh_redis, "gpu", 1)
        publish(fresh_redis, "gpu", 2, priority=PRIORITY)
        publish(fresh_redis, "io", 2)
        publish(fresh_redis, "provider.strava-fetcher", 4)
        publish(fresh_redis, "provider.garmin-fetcher", 1)
        publish(fresh_redis, "provider.gone-pool", 3)  # no live process names it
        assert client.llen("gpu") == 1  # the other two wait in a priority step's list
        with Connection(fresh_redis) as conn:
            taken = conn.SimpleQueue("io")
            message = taken.get(timeout=GET_TIMEOUT_S)  # delivered, not acked
            shown = scrape(collector)
            message.ack()
            taken.close()
    finally:
        client.close()
    waiting = {dict(labels)["queue"]: value for (name, labels), value in shown.items() if name == QUEUE_MESSAGES}
    assert waiting == {"gpu": 3, "io": 1, "provider.strava-fetcher": 4, "provider.garmin-fetcher": 1}
    assert shown[(UNACKED_MESSAGES, ())] == 1
    assert shown[(BROKER_UP, ())] == 1


def require_password(svc: services.Service, password: str) -> None:
    client = redis.Redis.from_url(svc.url)
    client.config_set("requirepass", password)
    client.close()


def test_a_scrape_while_redis_is_away_says_so_logs_once_and_counts_again_when_it_is_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fleet's own client (``REDIS_URL``, one try within ``SCRAPE_TIMEOUT_S``), its password kept out."""
    password = "queue-metrics-secret"
    register_secret(password)
    svc = services.start_redis(tmp_path / "redis")
    require_password(svc, password)
    url = svc.url.replace("redis://", f"redis://:{password}@")
    monkeypatch.setenv("REDIS_URL", url)
    collector = QueueLengths()
    try:
        publish(url, "gpu", 2)
        assert scrape(collector)[(QUEUE_MESSAGES, (("queue", "gpu"),))] == 2
        services.kill(svc)
        with caplog.at_level(logging.INFO, logger="tasks.queue_metrics"):
            away = [scrape(collector) for _ in range(3)]
            assert all(shown == {(BROKER_UP, ()): 0} for shown in away), away  # no stale length
            services.start_again(svc)  # appendonly off: the queue is empty again
            require_password(svc, password)
            back = scrape(collector)
        assert back[(QUEUE_MESSAGES, (("queue", "gpu"),))] == 0 and back[(BROKER_UP, ())] == 1
    finally:
        collector.close()
        svc.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # the outage once, not per scrape, then its end
    assert warnings[0].startswith("Redis unavailable (queue lengths: ConnectionError"), warnings
    assert warnings[1].startswith("Redis available again after"), warnings
    assert password not in caplog.text
