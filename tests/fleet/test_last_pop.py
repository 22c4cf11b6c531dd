"""A message popped by the BRPOP still in flight as a consumer's channel closes goes back untouched, quietly."""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from kombu import Connection, Producer

from tasks.hardening.transport import REDIS_TRANSPORT, RedisChannel
from tests.kit.waiting import wait_until

POP_TIMEOUT_S = 5.0
CONSUMER_TAG = "stopping-worker"
LONG_POP_TIMEOUT_S = 30  # a pending BRPOP the stop must not wait out
Consuming = tuple[Connection, RedisChannel, redis.Redis, str]  # the connection, its channel, a client, the queue


@pytest.fixture()
def consuming(redis_url: str) -> Iterator[Consuming]:
    """A connection and channel of the fleet's transport consuming a fresh queue, and a plain Redis client."""
    queue = f"last-pop-{uuid.uuid4().hex[:8]}"
    conn = Connection(redis_url, transport=REDIS_TRANSPORT)
    channel = conn.default_channel
    assert isinstance(channel, RedisChannel)
    channel.basic_consume(queue, False, lambda message: None, CONSUMER_TAG)
    client = redis.Redis.from_url(redis_url)
    try:
        yield conn, channel, client, queue
    finally:
        client.delete(queue)
        client.close()
        conn.release()


def test_a_message_popped_as_the_channel_closes_goes_back_to_the_head_of_its_queue(
        consuming: Consuming, caplog: pytest.LogCaptureFixture) -> None:
    conn, channel, client, queue = consuming
    channel.brpop_timeout = POP_TIMEOUT_S
    channel.connection.cycle._register_BRPOP(channel)  # the fetch a stopping worker left on the server
    publish = Producer(conn.channel()).publish
    publish("later", routing_key=queue, serializer="json")
    wait_until(lambda: client.llen(queue) == 0, POP_TIMEOUT_S, "the server to pop it into the pending reply")
    publish("earlier", routing_key=queue, serializer="json")  # queued behind it meanwhile
    channel.basic_cancel(CONSUMER_TAG)  # as Celery's stop does before the channel closes
    with caplog.at_level(logging.DEBUG):
        channel.close()
    bodies = [base64.b64decode(json.loads(raw)["body"]) for raw in client.lrange(queue, 0, -1)]
    assert bodies == [b'"earlier"', b'"later"']  # kombu pops from the right: "later" is next again
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert f"handed back a message for queue '{queue}'" in caplog.text


def test_a_pending_fetch_is_ended_at_once_and_hands_nothing_back(
        consuming: Consuming, caplog: pytest.LogCaptureFixture) -> None:
    """The stop does not wait out the pending BRPOP's timeout: it is unblocked and pops nothing."""
    conn, channel, client, queue = consuming
    channel.brpop_timeout = LONG_POP_TIMEOUT_S
    channel.connection.cycle._register_BRPOP(channel)
    wait_until(lambda: any(c.get("cmd") == "brpop" for c in client.client_list()), POP_TIMEOUT_S,
               "the server to hold the BRPOP")
    channel.basic_cancel(CONSUMER_TAG)
    started = time.monotonic()
    with caplog.at_level(logging.DEBUG):
        channel.close()
    assert time.monotonic() - started < LONG_POP_TIMEOUT_S / 2  # unblocked, not timed out
    assert client.llen(queue) == 0
    assert "handed back" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
