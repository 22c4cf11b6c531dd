"""What the dev core's JetStream holds, read for tests: presence, manifests, limits, consumers, KV."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any, TypeVar

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError

from devstack.fakes.cairn_core import bootstrap as bs
from devstack.fakes.cairn_core.accounts import utcnow
from devstack.fakes.cairn_core.scheduler import PRESENCE_LIVE_S, is_live, read_bucket

T = TypeVar("T")

CALL_TIMEOUT_S = 30.0  # upper bound for one call into the loop thread


class JetStreamView:
    """Synchronous calls into the core's loop thread, and the reads (and test writes) of its streams and KV."""

    _loop: asyncio.AbstractEventLoop | None  # DevCairnCore's, run by its daemon thread
    _js: JetStreamContext | None

    def _call(self, coro: Coroutine[Any, Any, T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("DevCairnCore is not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    @property
    def js(self) -> JetStreamContext:
        assert self._js is not None, "not started"
        return self._js

    def presence(self, worker_name: str | None = None) -> dict[str, Any]:
        match = None if worker_name is None else (lambda k: k.startswith(worker_name + "."))
        return self._call(read_bucket(self.js, bs.KV_PRESENCE, match))

    def live_presence(self, worker_name: str | None = None, max_age_s: float = PRESENCE_LIVE_S) -> dict[str, Any]:
        """Presence records core counts as live (fresh ``last_seen``, with a ``worker_key``)."""
        now = utcnow()
        return {key: rec for key, rec in self.presence(worker_name).items() if is_live(rec, now, max_age_s)}

    def manifests(self) -> dict[str, Any]:
        return self._call(read_bucket(self.js, bs.KV_MANIFESTS))

    def rate_limits(self) -> dict[str, Any]:
        return self._call(read_bucket(self.js, bs.KV_RATE_LIMITS))

    def consumers(self, stream: str = bs.STREAM_JOBS) -> list[dict[str, Any]]:
        """Consumers of ``stream`` as plain dicts (name, filters, ack_wait_s, max_deliver, pending)."""
        async def run() -> list[dict[str, Any]]:
            infos = await self.js.consumers_info(stream)
            return [{"name": i.name, "durable_name": i.config.durable_name,
                     "filter_subject": i.config.filter_subject, "filter_subjects": i.config.filter_subjects,
                     "ack_policy": i.config.ack_policy, "ack_wait_s": i.config.ack_wait,
                     "max_deliver": i.config.max_deliver, "deliver_policy": i.config.deliver_policy,
                     "num_pending": i.num_pending, "num_ack_pending": i.num_ack_pending,
                     "num_redelivered": i.num_redelivered} for i in infos]
        return self._call(run())

    def stream_info(self, name: str) -> Any:
        return self._call(self.js.stream_info(name))

    def stream_holds(self, seq: int, stream: str = bs.STREAM_JOBS) -> bool:
        """Whether ``stream`` still holds message ``seq``; on the work-queue job stream, whether the
        job is still pending (not yet acked or termed by the pool)."""
        async def run() -> bool:
            try:
                await self.js.get_msg(stream, seq)
            except NotFoundError:
                return False
            return True
        return self._call(run())

    def kv_get(self, bucket: str, key: str) -> Any:
        async def run() -> Any:
            try:
                raw = (await (await self.js.key_value(bucket)).get(key)).value or b""
            except (KeyNotFoundError, NotFoundError):
                return None
            try:
                return json.loads(raw)
            except ValueError:
                return raw
        return self._call(run())

    def kv_put(self, bucket: str, key: str, value: Any) -> None:
        raw = value if isinstance(value, bytes) else json.dumps(value).encode()
        self._call(self._kv_put(bucket, key, raw))

    async def _kv_put(self, bucket: str, key: str, raw: bytes) -> None:
        await (await self.js.key_value(bucket)).put(key, raw)

    def kv_delete(self, bucket: str, key: str) -> None:
        """Delete ``key`` (e.g. ``cairn_core``/``info``: an older core that publishes no release)."""
        async def run() -> None:
            await (await self.js.key_value(bucket)).delete(key)
        self._call(run())
