"""The Redis result backend: each result written with ``SET ... EX`` instead of ``SETEX``, and no
subscription per task sent.

Why: redis-py 8 marks ``setex`` deprecated and warns (``DeprecationWarning:
Call to deprecated setex. (Use 'set' instead.)``), following Redis, which has
regarded SETEX as superseded by ``SET key value EX seconds`` since 2.6.12 but
keeps serving it. Celery 5.7's ``RedisBackend._set`` still calls
``pipe.setex`` for every result stored with an expiry, and every one of ours
has one (``RESULT_EXPIRES_S``). Nothing breaks today; the warning only shows
where results are stored in a process that displays DeprecationWarnings (the
test run), but it would become an error the day redis-py drops ``setex``.

These subclasses keep Celery's write exactly: one pipeline, value and TTL set
atomically, then the ``PUBLISH`` the Cairn bridge's result waiter listens to.
``result_backend_url`` selects them from the plain ``REDIS_URL`` through
Celery's ``<class>+<url>`` form of ``result_backend``; any other scheme is
left to Celery.

**No subscription per task sent.** Celery's Redis backend subscribes to a
task's result channel the moment the task is sent (``on_task_call``), in case
the sender calls ``AsyncResult.get()`` later. Nothing in the fleet does: the
Cairn bridge waits on its own pub/sub (``bridges.cairn.results``), the Voicy
bridge and beat never wait. So every ``cairn.job`` the bridge sent cost a
``SUBSCRIBE`` on a connection nobody read: Redis pushed every result to it,
the set of subscribed task ids grew for the life of the bridge, and the server
drops such a connection once its unread output passes the pub/sub buffer
limit (``client-output-buffer-limit pubsub``; issue 15 §3). ``AsyncResult.get()`` still works: it subscribes
itself and reads the stored state first (``add_pending_result``), so a result
published before it started waiting is not lost.

They also report Celery's retries of a backend call through a Redis outage
(``result_backend_always_retry``) the way every other Redis client of the fleet
does (R1, :class:`workers.outage.Outage`): Celery logs each retry as a WARNING
with the connection error's traceback, so a worker finishing a job while Redis
restarts filled its log with tracebacks. The retry policy stays Celery's.
"""

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
    """Celery's ``_set`` with ``SET ... EX`` in place of the deprecated ``SETEX``."""

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
    """No ``SUBSCRIBE`` when a task is sent; a caller of ``AsyncResult.get()`` subscribes then."""

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
    """Celery's ``result_backend`` value for ``url``: our class for a Redis scheme, else ``url`` itself."""
    backend = BACKENDS.get(url.partition("://")[0])
    if backend is None:
        return url
    return f"{backend.__module__}:{backend.__qualname__}+{url}"
