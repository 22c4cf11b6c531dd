"""kombu's Redis and Sentinel transports: a crash on a broker failure turned into a reconnect, and
one blocking client per channel instead of one per command.

Found by ``tests/test_sentinel.py`` (about one failover in four): a message
arrives just as the master dies, so its ack fails and it stays in kombu's
unacked set. Celery's consumer then collects the broken connection: closing
the channel disconnects its pool and tries to restore that message, which
fails (no master yet), so the channel stays open while the connection's
transport is dropped. Celery then closes the connection once more; the
channel builds a new pool from ``self.connection.client``, now ``None``, and
the ``AttributeError`` is not a connection error, so Celery reports an
"Unrecoverable error" and the worker exits (R1). The same race exists on a
single Redis that crashes at that instant.

The channels here raise a Redis ``ConnectionError`` instead, which Celery's
close path ignores as it should: the consumer reconnects (to the promoted
master) and the unacked message is restored later by kombu's usual sweep; its
job is recovered sooner through its lease like any job whose worker lost
Redis. ``tasks.settings`` selects these classes with ``broker_transport``; they
change nothing else (TLS comes from ``broker_use_ssl``, as with kombu's own).

**One client per channel.** kombu's ``Channel.conn_or_acquire`` builds a new
``redis.Redis`` for every publish, every task-event flush and every unacked-
index update and ack (``QoS.pipe_or_acquire``). With redis-py 8 that
constructor alone costs about 0.1 ms of CPU (it fills a case-insensitive table
of response callbacks), and a Cairn job crosses it about six times between the
bridge and the worker (issue 15 §3). The client holds no connection of its own
(each command borrows one from the channel's pool), so the channels here build
it once per pool and hand the same one out; a pool that kombu replaces (after a
disconnect) gets a new client with it.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis

CLOSED_MESSAGE = "broker connection already closed"


class _GuardedConnparams:
    """Mixin: refuse to build a pool for a connection that was already collected."""

    connection: Any

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:
            raise redis.ConnectionError(CLOSED_MESSAGE)
        return super()._connparams(asynchronous)  # type: ignore[misc, no-any-return]


class _ReusedClient:
    """Mixin: ``conn_or_acquire`` hands out one blocking client per pool, not a new one per command."""

    _reused_client: redis.Redis | None = None
    pool: Any  # kombu's property: the channel's connection pool, built on first use

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the BRPOP and pub/sub clients: built once by kombu already
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        pool = self.pool  # may build it (and refuse, _GuardedConnparams) as kombu's own would
        client = self._reused_client
        if client is None or client.connection_pool is not pool:
            client = self._reused_client = super()._create_client(asynchronous=False)  # type: ignore[misc]
        return client


class RedisChannel(_GuardedConnparams, _ReusedClient, kombu_redis.Channel):
    pass


class SentinelChannel(_GuardedConnparams, _ReusedClient, kombu_redis.SentinelChannel):
    pass


class RedisTransport(kombu_redis.Transport):
    """``redis://`` and ``rediss://`` brokers."""

    Channel = RedisChannel


class SentinelTransport(kombu_redis.SentinelTransport):
    """``sentinel://`` brokers."""

    Channel = SentinelChannel


REDIS_TRANSPORT = f"{__name__}:RedisTransport"
SENTINEL_TRANSPORT = f"{__name__}:SentinelTransport"
