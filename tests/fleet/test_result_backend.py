"""The fleet's result backend writes each result with SET EX (no deprecated SETEX), TTL and PUBLISH intact."""

from __future__ import annotations

import json
import logging
import threading
import uuid
import warnings
from pathlib import Path

import pytest
import redis
from celery import Celery, states
from celery.app.backends import by_url

from devstack.infra import services
from tasks import hardening
from tasks.hardening.result_backend import RedisBackend, SentinelBackend, result_backend_url
from tasks.routes import provider_queue
from tasks.settings import RESULT_EXPIRES_S, FleetSettings, celery_config
from tests.kit.waiting import wait_until

SUBSCRIBE_WAIT_S = 5.0
OUTAGE_WAIT_S = 30.0
RETRY_LOGGERS = ("celery.backends", "tasks.hardening.result_backend")  # Celery's retry loop, or ours reporting it
RETRIES_SEEN = 3  # the write is retried a few times while Redis is down: one warning, not one per retry


def release(backend: RedisBackend) -> None:
    """Close the connections ``backend`` holds (its result pubsub, its pool). ``Celery.close`` leaves them
    to the garbage collector, which may finalize a socket before the redis-py connection that would close
    it quietly: a ResourceWarning then fails whichever test of the worker is running."""
    backend.result_consumer.stop()
    backend.client.connection_pool.disconnect()


def test_results_are_stored_with_expiry_and_published_without_a_deprecation_warning(fresh_redis: str) -> None:
    app = Celery("result-backend-test")
    app.conf.update(celery_config(FleetSettings(redis_url=fresh_redis)))
    hardening.install(app)
    assert isinstance(app.backend, RedisBackend)
    task_id = f"rb-{uuid.uuid4().hex}"
    key = f"celery-task-meta-{task_id}"
    client = redis.Redis.from_url(fresh_redis)
    pubsub = client.pubsub()
    pubsub.subscribe(key)
    assert pubsub.get_message(timeout=SUBSCRIBE_WAIT_S)["type"] == "subscribe"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # redis-py 8 warns on every SETEX
        app.backend.store_result(task_id, {"action": "ack"}, states.SUCCESS)
    stored = client.get(key)
    assert stored is not None and json.loads(stored)["result"] == {"action": "ack"}
    assert 0 < client.ttl(key) <= RESULT_EXPIRES_S
    published = pubsub.get_message(timeout=SUBSCRIBE_WAIT_S)
    assert published is not None and published["channel"] == key.encode()
    assert json.loads(published["data"])["status"] == states.SUCCESS
    pubsub.close()
    client.close()
    release(app.backend)


@pytest.mark.parametrize(("url", "backend"), [
    ("redis://h:6379/0", RedisBackend), ("rediss://h:6380/0", RedisBackend),
    ("sentinel://h:26379;sentinel://g:26379", SentinelBackend),
])
def test_celery_resolves_our_class_for_each_redis_scheme(url: str, backend: type) -> None:
    assert by_url(result_backend_url(url)) == (backend, url)


def test_other_schemes_are_left_to_celery() -> None:
    assert result_backend_url("db+sqlite:///results.db") == "db+sqlite:///results.db"


def test_sending_a_task_subscribes_nobody_and_get_still_hears_its_result(fresh_redis: str) -> None:
    """Celery subscribed to every sent task's result channel in case the sender waits on it; the
    bridge never does, so each job left a subscription on a connection nobody read (issue 15 §3)."""
    app = Celery("result-backend-send")
    app.conf.update(celery_config(FleetSettings(redis_url=fresh_redis)))
    hardening.install(app)
    client = redis.Redis.from_url(fresh_redis)
    sent = [app.send_task("cairn.job", args=["fetch_source", {}, {}], task_id=f"rb-{uuid.uuid4().hex}",
                          queue=provider_queue("rb")) for _ in range(3)]
    keys = [f"celery-task-meta-{r.id}" for r in sent]
    assert [n for _, n in client.pubsub_numsub(*keys)] == [0, 0, 0]
    assert not app.backend.result_consumer.subscribed_to

    done = sent[0]
    app.backend.store_result(done.id, {"action": "ack"}, states.SUCCESS)  # stored before anyone waits
    assert done.get(timeout=SUBSCRIBE_WAIT_S) == {"action": "ack"}

    waiting = sent[1]  # stored while get() waits: heard through the subscription get() makes itself
    backend = app.backend  # the app's backend is per thread: the writer uses this one, released below
    store = threading.Thread(target=lambda: (
        wait_until(lambda: client.pubsub_numsub(keys[1])[0][1] == 1, SUBSCRIBE_WAIT_S, "get() to subscribe"),
        backend.store_result(waiting.id, {"action": "nak"}, states.SUCCESS)))
    store.start()
    assert waiting.get(timeout=SUBSCRIBE_WAIT_S * 2) == {"action": "nak"}
    store.join()
    client.close()
    release(backend)
    app.close()


def test_a_redis_outage_under_a_result_write_is_logged_once_without_a_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """R1: Celery retries a result write through an outage (``result_backend_always_retry``) and used to
    log every retry as a WARNING with the connection error's traceback (a worker finishing a job while
    Redis restarts: found under load by test_cairn_outages). Now the outage is one warning naming the
    exception, the retries are DEBUG, one line says Redis is back, and the result is stored."""
    svc = services.start_redis(tmp_path / "redis")
    try:
        app = Celery("result-backend-outage")
        app.conf.update(celery_config(FleetSettings(redis_url=svc.url)))
        hardening.install(app)
        backend = app.backend
        task_id = f"rb-{uuid.uuid4().hex}"
        backend.store_result(f"{task_id}-before", {"action": "ack"}, states.SUCCESS)  # connected before the outage
        caplog.set_level(logging.DEBUG)
        services.kill(svc)
        writer = threading.Thread(target=backend.store_result, args=(task_id, {"action": "ack"}, states.SUCCESS))
        writer.start()
        wait_until(lambda: sum(r.name.startswith(RETRY_LOGGERS) for r in caplog.records) >= RETRIES_SEEN,
                   OUTAGE_WAIT_S, "the write to be retried during the outage")
        services.start_again(svc)
        writer.join(OUTAGE_WAIT_S)
        assert not writer.is_alive(), "the result write never ended after Redis came back"
        with redis.Redis.from_url(svc.url) as client:
            stored = client.get(f"celery-task-meta-{task_id}")
        assert stored is not None and json.loads(stored)["result"] == {"action": "ack"}
        release(backend)
    finally:
        svc.stop()
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r for r in loud if r.exc_info or "Traceback" in r.getMessage()] == [], [r.getMessage() for r in loud]
    assert sum(r.getMessage().startswith("Redis unavailable (result backend") for r in loud) == 1, \
        [r.getMessage() for r in loud]
    assert sum(r.getMessage().startswith("Redis available again") for r in loud) == 1, [r.getMessage() for r in loud]
