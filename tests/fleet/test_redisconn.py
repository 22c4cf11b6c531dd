"""``REDIS_URL`` is read in one place and understood the same way by Celery and our own clients.

The Sentinel spelling is kombu's (``sentinel://host:port;sentinel://...`` plus
a master name); a Sentinel URL without ``REDIS_SENTINEL_MASTER`` stops start-up
naming the variable. Celery gets the master name for the broker *and* the
result backend (forgetting the latter leaves results on a demoted master).
Failover itself is tested against real servers in ``test_sentinel.py``.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import ssl
import uuid

import pytest
import redis
from celery import Celery
from kombu import Connection, Queue
from kombu.transport import redis as kombu_redis
from kombu.transport.redis import Transport as KombuTransport

from tasks import hardening
from tasks.hardening.consumer import CONSUMER
from tasks.hardening.result_backend import result_backend_url
from tasks.hardening.transport import REDIS_TRANSPORT, SENTINEL_TRANSPORT
from tasks.settings import FleetSettings, celery_config
from workers.config import load_settings
from workers.errors import ConfigError
from workers.outage import SAME_OUTAGE_S, Outage
from workers.redisconn import RedisSettings, parse_sentinel_url, shown_url, sync_client

SENTINELS = "sentinel://:pw@10.0.0.1:26379/2;sentinel://10.0.0.2:26380;sentinel://10.0.0.3"


@pytest.fixture()
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in ("REDIS_URL", "REDIS_SENTINEL_MASTER", "REDIS_SSL_CERT_REQS", "REDIS_SSL_CA_CERTS"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_a_sentinel_url_is_parsed_as_kombu_spells_it() -> None:
    parsed = parse_sentinel_url(SENTINELS)
    assert parsed.hosts == (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379))
    assert (parsed.db, parsed.password, parsed.username) == (2, "pw", None)
    with pytest.raises(ValueError):
        parse_sentinel_url("sentinel://a:1;redis://b:2")
    with pytest.raises(ValueError):
        parse_sentinel_url("sentinel://a:1/x")


def test_bad_redis_settings_name_the_variable_and_never_echo_the_value(env: pytest.MonkeyPatch) -> None:
    env.setenv("REDIS_URL", "notaurl-secretpw")
    with pytest.raises(ConfigError, match="REDIS_URL") as exc:
        load_settings(RedisSettings)
    assert "secretpw" not in str(exc.value)
    env.setenv("REDIS_URL", SENTINELS)
    with pytest.raises(ConfigError) as across:  # a check across variables: its message names them, no "?:"
        load_settings(FleetSettings)
    assert str(across.value) == ("invalid configuration: REDIS_SENTINEL_MASTER must name the master when REDIS_URL "
                                 "lists Sentinels")
    env.setenv("REDIS_SENTINEL_MASTER", "switchyard")
    assert load_settings(FleetSettings).sentinel


def test_celery_follows_the_sentinels_for_broker_and_result_backend(env: pytest.MonkeyPatch) -> None:
    env.setenv("REDIS_URL", SENTINELS)
    env.setenv("REDIS_SENTINEL_MASTER", "switchyard")
    conf = celery_config()
    assert conf["broker_url"] == conf["redbeat_redis_url"] == conf["result_backend"] == SENTINELS
    app = Celery("sentinel-config")
    app.conf.update(conf)
    hardening.install(app)  # our Sentinel transport and backend, writing SET EX
    assert app.conf.result_backend == result_backend_url(SENTINELS)
    assert app.conf.result_backend.endswith("+" + SENTINELS) and "SentinelBackend" in app.conf.result_backend
    assert app.conf.broker_transport == SENTINEL_TRANSPORT and app.conf.worker_consumer == CONSUMER
    for key in ("broker_transport_options", "result_backend_transport_options"):
        assert conf[key]["master_name"] == "switchyard", key
        assert conf[key]["password"] == "pw", key  # kombu reads the master's password only from here
    assert conf["broker_transport_options"]["visibility_timeout"] == conf["visibility_timeout"]
    assert conf["broker_connection_max_retries"] is None and conf["result_backend_always_retry"]


def test_celery_config_for_a_plain_and_a_tls_url(env: pytest.MonkeyPatch) -> None:
    env.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    assert "master_name" not in celery_config()["broker_transport_options"]
    env.setenv("REDIS_URL", "rediss://h:6380/0")
    env.setenv("REDIS_SSL_CERT_REQS", "required")
    conf = celery_config()
    assert conf["broker_use_ssl"] == conf["redis_backend_use_ssl"] == {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    env.setenv("REDIS_SSL_CA_CERTS", __file__)  # any file: only read when a connection is made
    conf = celery_config()
    assert conf["broker_use_ssl"] == conf["redis_backend_use_ssl"] == {"ssl_cert_reqs": ssl.CERT_REQUIRED,
                                                                        "ssl_ca_certs": __file__}


def test_sync_client_on_a_plain_url_talks_to_that_server(redis_url: str) -> None:
    client = sync_client(redis_url)
    try:
        assert client.ping()
    finally:
        client.close()


def test_an_outage_is_logged_once_backs_off_and_logs_its_end(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    now = [1000.0]
    outage = Outage("Redis", logging.getLogger("test.outage"), loop="the loop", setting="REDIS_URL",
                    initial_s=1.0, max_s=4.0, clock=lambda: now[0])
    delays = [outage.failed("poll", redis.ConnectionError("boom")) for _ in range(5)]
    assert delays == [1.0, 2.0, 4.0, 4.0, 4.0]
    outage.ok()
    outage.ok()
    now[0] += SAME_OUTAGE_S + 1  # later than the tail of the outage that just ended
    assert outage.failed("poll", redis.ConnectionError("again")) == 1.0  # the backoff starts over
    text = [r.getMessage() for r in caplog.records if r.name == "test.outage"]
    assert sum("Redis unavailable at REDIS_URL (ConnectionError: " in t for t in text) == 2  # two outages
    assert sum("Redis available again; the loop resumed" in t for t in text) == 1


def test_a_collected_broker_channel_reports_a_connection_error_not_a_crash(redis_url: str) -> None:
    """The race of ``tasks/hardening/transport.py``: a second close of a channel whose connection was collected.

    Celery's close path ignores connection errors only; kombu's own channel raised AttributeError
    there and Celery stopped the worker ("Unrecoverable error").
    """
    for transport, expected in ((REDIS_TRANSPORT, redis.ConnectionError), (KombuTransport, AttributeError)):
        conn = Connection(redis_url, transport=transport)
        channel = conn.default_channel
        assert isinstance(channel, kombu_redis.Channel)
        channel._disconnect_pools()  # what the first, failed close did
        channel.connection.client = None  # what collect() did to the transport
        with pytest.raises(expected):
            channel.pool  # noqa: B018 - the property builds the pool
        assert isinstance(expected(), tuple(conn.connection_errors)) == (expected is redis.ConnectionError)


def test_the_broker_channel_builds_one_client_per_pool_not_one_per_command(redis_url: str) -> None:
    """kombu's own channel builds a ``redis.Redis`` for every publish, ack and event flush (about
    0.1 ms of CPU each with redis-py 8, issue 15 §3); ours hands out one per connection pool, and a
    new one with the pool kombu builds after a disconnect."""
    stock = Connection(redis_url, transport=KombuTransport)
    stock_channel = stock.default_channel
    assert isinstance(stock_channel, kombu_redis.Channel)
    with stock_channel.conn_or_acquire() as a, stock_channel.conn_or_acquire() as b:
        assert a is not b  # what the fleet's transport avoids
    stock.release()
    conn = Connection(redis_url, transport=REDIS_TRANSPORT)
    channel = conn.default_channel
    assert isinstance(channel, kombu_redis.Channel)
    with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
        assert first is second and first.connection_pool is channel.pool
    queue = f"transport-probe-{uuid.uuid4().hex[:8]}"
    conn.Producer().publish({"probe": 1}, routing_key=queue, declare=[Queue(queue)])
    assert redis.Redis.from_url(redis_url).llen(queue) == 1  # commands still go out through it
    channel._disconnect_pools()  # what a connection error does: kombu builds a new pool on next use
    with channel.conn_or_acquire() as third:
        assert third is not first and third.connection_pool is channel.pool
    conn.release()


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:pw@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
    ("rediss://ops:p@ss/w:rd@h:6380/1?ssl_cert_reqs=none", "rediss://ops:***@h:6380/1?ssl_cert_reqs=none"),
    (SENTINELS.replace("10.0.0.2", "u:pw2@10.0.0.2"),
     "sentinel://:***@10.0.0.1:26379/2;sentinel://u:***@10.0.0.2:26380;sentinel://10.0.0.3"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
], ids=["password", "user-and-odd-password", "sentinels", "none"])
def test_a_url_is_shown_with_every_password_masked(url: str, shown: str) -> None:
    """What the doctor and the verdict print when Redis does not answer: the URL tried, no password."""
    assert shown_url(url) == shown


# kombu 5.7.0's ``Channel._brpop_read``, which tasks/hardening/unreadable.py mirrors with its decode guarded.
KOMBU_BRPOP_READ_SHA256 = "c42518699709f2df90f55a048fe6346612ae5527e5c4a6819f2c0920dc62088f"


def test_the_mirrored_brpop_read_is_still_kombus_own() -> None:
    """A kombu that changes its BRPOP read fails here: compare it with ``SetAsideUnreadable._brpop_read``,
    carry the change over, then record the new digest."""
    source = inspect.getsource(kombu_redis.Channel._brpop_read)
    assert hashlib.sha256(source.encode()).hexdigest() == KOMBU_BRPOP_READ_SHA256, source
