"""kombu's Redis and Sentinel transports: a broker failure is a reconnect, one client per channel."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

from tasks.hardening.last_pop import HandBackLastPop
from tasks.hardening.unreadable import SetAsideUnreadable

CLOSED_MESSAGE = "broker connection already closed"
UNACKED_KEY = kombu_redis.Channel.unacked_key
PRIORITY_SEP = kombu_redis.Channel.sep
PRIORITY_STEPS = tuple(kombu_redis.PRIORITY_STEPS)


class _GuardedConnparams:
    """Mixin: refuse to build a pool for a connection that was already collected.

    When the master dies just as a message arrives, its ack fails and Celery's close path
    collects the connection twice; the second time kombu would build a pool from a ``None``
    client and raise an ``AttributeError`` Celery calls unrecoverable, and the worker exits.
    A Redis ``ConnectionError`` instead is ignored as it should be: the consumer reconnects
    (R1) and the unacked message is restored by kombu's sweep or recovered through its lease.
    """

    connection: Any

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:
            raise redis.ConnectionError(CLOSED_MESSAGE)
        return super()._connparams(asynchronous)  # type: ignore[misc]


class _ReusedClient:
    """Mixin: ``conn_or_acquire`` hands out one blocking client per pool, not a new one per command.

    kombu builds a ``redis.Redis`` for every publish, event flush and ack, and redis-py 8's
    constructor is not free. The client holds no connection (each command borrows one from the
    pool), so one per pool is safe; a pool kombu replaces after a disconnect gets a new one.
    """

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


class RedisChannel(_GuardedConnparams, _ReusedClient, HandBackLastPop, SetAsideUnreadable, kombu_redis.Channel):
    pass


class SentinelChannel(_GuardedConnparams, _ReusedClient, HandBackLastPop, SetAsideUnreadable,
                      kombu_redis.SentinelChannel):
    pass


class RedisTransport(kombu_redis.Transport):
    """``redis://`` and ``rediss://`` brokers."""

    Channel = RedisChannel


class SentinelTransport(kombu_redis.SentinelTransport):
    """``sentinel://`` brokers."""

    Channel = SentinelChannel


REDIS_TRANSPORT = f"{__name__}:RedisTransport"
SENTINEL_TRANSPORT = f"{__name__}:SentinelTransport"
TRANSPORTS = {"redis": REDIS_TRANSPORT, "rediss": REDIS_TRANSPORT, "sentinel": SENTINEL_TRANSPORT}


def install(app: Any) -> None:
    """Run ``app``'s broker on our transport of the configured kind (``redis`` or ``sentinel``)."""
    kind = app.conf.broker_transport or str(app.conf.broker_url).partition("://")[0]
    app.conf.broker_transport = TRANSPORTS.get(kind, kind)


@dataclass(frozen=True)
class TaskMessage:
    """One task message in the broker: the task's name and its positional arguments."""

    task: str
    args: tuple[Any, ...]


def queue_keys(queue: str) -> list[str]:
    """The Redis lists of ``queue``, one per kombu priority step (the step 0 list is the queue's name)."""
    return [f"{queue}{PRIORITY_SEP}{step}" if step else queue for step in PRIORITY_STEPS]


def task_messages(client: redis.Redis, queues: Iterable[str],
                  tasks: frozenset[str]) -> tuple[list[TaskMessage], list[TaskMessage]]:
    """The messages of ``tasks`` waiting in ``queues``, and those delivered and not acked (any queue).

    The one place that knows kombu's Redis layout: a list per priority step (``io``,
    ``io\x06\x163``), the ``unacked`` hash of ``[message, exchange, routing_key]``, Celery's JSON
    envelope with a base64 ``[args, kwargs, embed]`` body. Used by the Voicy grant audit
    (``workers.voicy.grants``); assumes kombu's default key names, which ``tasks.settings`` keeps.

    One ``MULTI`` reads every list and the ``unacked`` hash, so a message moving
    between them is not seen in both or missed by both at once. A message that
    does not decode is skipped: it is not one of ours to judge.
    """
    keys = [key for queue in queues for key in queue_keys(queue)]
    with client.pipeline(transaction=True) as pipe:
        for key in keys:
            pipe.lrange(key, 0, -1)
        pipe.hvals(UNACKED_KEY)
        *lists, unacked = pipe.execute()
    names = tuple(name.encode() for name in tasks)
    waiting = [m for items in lists for raw in items if _names_one(raw, names) and (m := _decode(raw, tasks))]
    delivered = [m for raw in unacked if _names_one(raw, names) and (m := _decode_unacked(raw, tasks))]
    return waiting, delivered


def _names_one(raw: bytes | str, names: tuple[bytes, ...]) -> bool:
    """Whether the raw message may be one of ours: beat's housekeeping piles up in ``io`` while its
    workers are busy, and a byte search skips it several times faster than decoding it."""
    data = raw.encode() if isinstance(raw, str) else raw
    return any(name in data for name in names)


def _decode_unacked(raw: bytes | str, tasks: frozenset[str]) -> TaskMessage | None:
    try:
        message = json.loads(raw)[0]
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    return _decode_envelope(message, tasks)


def _decode(raw: bytes | str, tasks: frozenset[str]) -> TaskMessage | None:
    try:
        return _decode_envelope(json.loads(raw), tasks)
    except ValueError:
        return None


def _decode_envelope(message: Any, tasks: frozenset[str]) -> TaskMessage | None:
    """A Celery (protocol 2) JSON message of one of ``tasks``, decoded; None for anything else."""
    if not isinstance(message, dict):
        return None
    name = (message.get("headers") or {}).get("task")
    if name not in tasks or message.get("content-type") != "application/json":
        return None
    try:
        body = message["body"]
        if (message.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
    except (KeyError, ValueError, TypeError, IndexError, binascii.Error):
        return None
    return TaskMessage(name, tuple(args)) if isinstance(args, list) else None
