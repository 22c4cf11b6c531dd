"""kombu's Redis and Sentinel transports, with one crash on a broker failure turned into a reconnect.

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


class RedisChannel(_GuardedConnparams, kombu_redis.Channel):
    pass


class SentinelChannel(_GuardedConnparams, kombu_redis.SentinelChannel):
    pass


class RedisTransport(kombu_redis.Transport):
    """``redis://`` and ``rediss://`` brokers."""

    Channel = RedisChannel


class SentinelTransport(kombu_redis.SentinelTransport):
    """``sentinel://`` brokers."""

    Channel = SentinelChannel


REDIS_TRANSPORT = f"{__name__}:RedisTransport"
SENTINEL_TRANSPORT = f"{__name__}:SentinelTransport"
