"""The Redis result backend: results written with ``SET ... EX``, and no subscription per task sent."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from celery.backends.redis import RedisBackend as CeleryRedisBackend
from celery.backends.redis import SentinelBackend as CelerySentinelBackend
from celery.utils.serialization import raise_with_context
from celery.utils.time import get_exponential_backoff_interval

from workers import dead_peers
from workers.outage import Outage

log = logging.getLogger(__name__)


class _SetWithExpiry:
    """Celery's ``_set`` with ``SET ... EX`` in place of the deprecated ``SETEX``.

    redis-py 8 warns on ``setex`` and Celery still calls it for every result with an expiry
    (all of ours). The write is otherwise Celery's: one pipeline, value and TTL set atomically,
    then the ``PUBLISH`` the Cairn bridge's result waiter listens to.
    """

    client: Any
    expires: Any

    def _set(self, key: str, value: Any, expires: Any = None) -> None:
        if expires is None:
            expires = self.expires
        with self.client.pipeline() as pipe:
            if expires:
                pipe.set(key, value, ex=expires if isinstance(expires, timedelta) else int(expires))
            else:
                pipe.set(key, value)
            pipe.publish(key, value)
            pipe.execute()


class _NoSubscriptionAtSend:
    """No ``SUBSCRIBE`` when a task is sent; a caller of ``AsyncResult.get()`` subscribes then.

    Nothing in the fleet waits through Celery (the Cairn bridge has its own pub/sub,
    ``bridges.cairn.results``), so a subscription per send is a connection nobody reads, which
    Redis drops once it passes ``client-output-buffer-limit pubsub``. ``get()`` still works: it
    subscribes and reads the stored state first.
    """

    def on_task_call(self, producer: Any, task_id: str) -> None:
        return None


class _RetriesReportedOnce:
    """Celery's ``Backend._ensure_retryable`` (same limit, backoff and hook), each failure reported to an
    :class:`Outage`: the first one a warning naming the exception, the rest DEBUG, the recovery one line."""

    always_retry: bool
    max_retries: int
    base_sleep_between_retries_ms: int
    max_sleep_between_retries_ms: int
    exception_safe_to_retry: Callable[[BaseException], bool]
    on_backend_retryable_error: Callable[[BaseException], None]
    _sleep: Callable[[float], None]
    _redis_outage: Outage | None = None

    def _ensure_retryable(self, func: Callable[..., Any], *args: Any, fallback_exc: Any = None,
                          fallback_msg: str | None = None, max_retries: int | None = None, **kwargs: Any) -> Any:
        if self._redis_outage is None:
            self._redis_outage = Outage("Redis", log)
        outage = self._redis_outage
        limit = self.max_retries if max_retries is None else max_retries
        retries = 0
        while True:
            try:
                result = func(*args, **kwargs)
            except Exception as exc:
                if not (self.always_retry and self.exception_safe_to_retry(exc)):
                    raise
                if retries >= limit:
                    if fallback_exc:
                        raise_with_context(fallback_exc(fallback_msg))
                    raise
                retries += 1
                outage.failed(f"result backend {getattr(func, '__name__', 'call')}", exc)
                try:
                    self.on_backend_retryable_error(exc)
                except Exception:  # as Celery's loop: a failing hook does not end the retries
                    log.exception("on_backend_retryable_error hook failed; continuing retry loop")
                self._sleep(get_exponential_backoff_interval(self.base_sleep_between_retries_ms, retries,
                                                             self.max_sleep_between_retries_ms, True) / 1000)
            else:
                outage.ok()
                return result


class _DeadPeersFound:
    """Keepalive and ``TCP_USER_TIMEOUT`` on the backend's sockets (workers/dead_peers.py): Celery passes
    ``redis_socket_keepalive`` on, but not the options that bound a silent cut."""

    connparams: dict[str, Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connparams["socket_keepalive_options"] = dead_peers.tcp_options()


class RedisBackend(_SetWithExpiry, _NoSubscriptionAtSend, _RetriesReportedOnce, _DeadPeersFound, CeleryRedisBackend):
    """``redis://`` and ``rediss://`` results."""


class SentinelBackend(_SetWithExpiry, _NoSubscriptionAtSend, _RetriesReportedOnce, _DeadPeersFound,
                      CelerySentinelBackend):
    """``sentinel://`` results (Celery's Sentinel backend, same write)."""


BACKENDS: dict[str, type] = {"redis": RedisBackend, "rediss": RedisBackend, "sentinel": SentinelBackend}


def result_backend_url(url: str) -> str:
    """Celery's ``result_backend`` value for ``url``: our class for a Redis scheme, else ``url`` itself.

    Celery's ``<class>+<url>`` form of ``result_backend``.
    """
    backend = BACKENDS.get(url.partition("://")[0])
    if backend is None:
        return url
    return f"{backend.__module__}:{backend.__qualname__}+{url}"


def install(app: Any) -> None:
    """Store ``app``'s results through our backend class for its Redis URL (idempotent)."""
    app.conf.result_backend = result_backend_url(str(app.conf.result_backend))
