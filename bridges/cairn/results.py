"""Await Celery task results from asyncio without polling: the Redis backend pushes them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from celery import states

from workers.outage import REDIS_UNAVAILABLE, Outage, backoff_s
from workers.redisconn import async_client

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 1.0  # pub/sub read wake-up, so a closed waiter notices promptly
CONNECTED_CHANNEL = b"sy:cairn:results:connected"  # subscribed first: it opens the one connection


@dataclass
class TaskWatch:
    """The states one task has reached, as the backend announced them."""

    task_id: str
    started: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Future[dict[str, Any]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    state: str = states.PENDING

    def _update(self, meta: dict[str, Any]) -> None:
        status = str(meta.get("status", states.PENDING))
        self.state = status
        if status != states.PENDING:
            self.started.set()
        if status in states.READY_STATES and not self.done.done():
            self.done.set_result(meta)


class TaskResults:
    """One pub/sub connection; ``watch(task_id)`` before sending, then await ``done``.

    ``backend`` is the Celery app's result backend (``app.backend``): only its key
    names and decoder are used, so nothing here re-implements Celery's format. Not
    ``AsyncResult.get`` in a thread per message: up to ``CAIRN_MAX_IN_FLIGHT`` threads would
    exhaust the executor and starve the ``in_progress`` ticks. The bridge's own ``cairn.job``
    ids share the pool's prefix, so one pattern subscription covers them all (``covered``), live
    before any is sent; other tasks keep a subscription of their own.
    """

    def __init__(self, backend: Any, redis_url: str, *, redis_outage: Outage | None = None,
                 covered: str | None = None) -> None:
        self._backend = backend
        # task ids starting with ``covered`` are heard through one pattern subscription
        self._covered = covered
        self._pattern = self._key(f"{covered}*") if covered else None
        self._outage = redis_outage or Outage("Redis")
        self._redis = async_client(redis_url)
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        self._watches: dict[bytes, TaskWatch] = {}
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    def _key(self, task_id: str) -> bytes:
        key = self._backend.get_key_for_task(task_id)
        return key if isinstance(key, bytes) else str(key).encode()

    async def start(self) -> None:
        """Open the one pub/sub connection and its reader (also done by the first ``watch``)."""
        async with self._lock:
            await self._connect()

    async def _connect(self) -> None:
        """Under the lock: make sure the pub/sub has its connection and a reader reads it.

        A ``PubSub`` picks its connection lazily on its first command; two waiters subscribing
        at once would each take one, and one subscription would live on a connection nobody
        reads. So it is opened once, under the lock every (un)subscribe takes too.
        """
        if self._pubsub.connection is None:
            await self._pubsub.subscribe(CONNECTED_CHANNEL)
            if self._pattern is not None:
                await self._pubsub.psubscribe(self._pattern)
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read_loop(), name="cairn-task-results")

    def _is_covered(self, task_id: str) -> bool:
        return self._covered is not None and task_id.startswith(self._covered)

    async def watch(self, task_id: str) -> TaskWatch:
        """Subscribe to ``task_id``'s state changes; call before the task is sent.

        The key is read once after subscribing, so a state published before is not lost.
        """
        key = self._key(task_id)
        watch = TaskWatch(task_id)
        self._watches[key] = watch
        if self._is_covered(task_id):
            if self._reader is None or self._pubsub.connection is None:
                try:
                    async with self._lock:
                        await self._connect()
                except BaseException:
                    self._watches.pop(key, None)
                    raise
            return watch  # the pattern is live and the task not sent yet: nothing to read
        try:
            async with self._lock:
                await self._connect()
                try:
                    await self._pubsub.subscribe(key)
                except Exception:  # noqa: BLE001 - the connection broke (a Redis restart): take a new one now
                    if not await self._replace_locked():  # subscribes every watched key, this one included
                        raise
            try:
                current = await self._redis.get(key)
            except REDIS_UNAVAILABLE:  # a pooled connection that died with the old server: one more try
                current = await self._redis.get(key)
        except BaseException:
            self._watches.pop(key, None)  # a watch nobody will forget must not be resubscribed for ever
            raise
        if current is not None:
            watch._update(self._backend.decode_result(current))
        return watch

    async def stored(self, task_id: str) -> dict[str, Any] | None:
        """The task's stored state (a ``GET``, no pub/sub): the read before giving a task up."""
        current = await self._redis.get(self._key(task_id))
        return None if current is None else self._backend.decode_result(current)

    async def forget(self, watch: TaskWatch) -> None:
        key = self._key(watch.task_id)
        if self._watches.pop(key, None) is not None and not self._is_covered(watch.task_id):
            with contextlib.suppress(Exception):
                async with self._lock:
                    await self._pubsub.unsubscribe(key)

    async def _read_loop(self) -> None:
        """Read the one connection for ever; a broken one is replaced, with backoff, until Redis is back.

        A Redis restart breaks the connection and forgets every subscription;
        the replacement subscribes to every watched key again and reads each
        once (a result stored during the outage was never published to us).
        """
        failures = 0
        while not self._closed:
            try:
                message = await self._pubsub.get_message(timeout=READ_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reconnect and re-read every watched key
                self._outage.failed("result pub/sub", exc)
                await asyncio.sleep(backoff_s(failures))
                failures += 1
                if await self._resubscribe():
                    failures = 0
                    self._outage.ok()
                    log.info("result pub/sub resubscribed to %d task(s)", len(self._watches))
                continue
            if not message or message.get("type") not in ("message", "pmessage"):
                continue
            watch = self._watches.get(message["channel"])
            if watch is not None:
                watch._update(self._backend.decode_result(message["data"]))

    async def _resubscribe(self) -> bool:
        """A fresh pub/sub on every watched key, then one read of each; False if Redis is still away."""
        async with self._lock:
            return await self._replace_locked()

    async def _replace_locked(self) -> bool:
        with contextlib.suppress(Exception):
            await self._pubsub.aclose()
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        keys = list(self._watches)
        try:
            await self._pubsub.subscribe(CONNECTED_CHANNEL, *[k for k in keys
                                                              if not self._is_covered(self._watches[k].task_id)])
            if self._pattern is not None:
                await self._pubsub.psubscribe(self._pattern)
            if keys:
                for key, current in zip(keys, await self._redis.mget(keys), strict=True):
                    if current is not None and key in self._watches:
                        self._watches[key]._update(self._backend.decode_result(current))
        except Exception as exc:  # noqa: BLE001 - still down: the read loop backs off and tries again
            self._outage.failed("result pub/sub resubscribe", exc)
            return False
        return True

    async def close(self) -> None:
        self._closed = True
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
        with contextlib.suppress(Exception):
            await self._pubsub.aclose()
        await self._redis.aclose()
