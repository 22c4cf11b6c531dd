"""The Redis result backend, writing each result with ``SET ... EX`` instead of ``SETEX``.

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
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery.backends.redis import RedisBackend as CeleryRedisBackend
from celery.backends.redis import SentinelBackend as CelerySentinelBackend


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


class RedisBackend(_SetWithExpiry, CeleryRedisBackend):
    """``redis://`` and ``rediss://`` results."""


class SentinelBackend(_SetWithExpiry, CelerySentinelBackend):
    """``sentinel://`` results (Celery's Sentinel backend, same write)."""


BACKENDS: dict[str, type] = {"redis": RedisBackend, "rediss": RedisBackend, "sentinel": SentinelBackend}


def result_backend_url(url: str) -> str:
    """Celery's ``result_backend`` value for ``url``: our class for a Redis scheme, else ``url`` itself."""
    backend = BACKENDS.get(url.partition("://")[0])
    if backend is None:
        return url
    return f"{backend.__module__}:{backend.__qualname__}+{url}"
