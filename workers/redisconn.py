"""Every Redis client of the fleet is built here, from one ``REDIS_URL``.

Why one place: the broker, the result backend, leases, the Voicy fleet
records, Cairn failure counts, the outcome ledger and sealed secrets must all
follow the same Redis, including through a Sentinel failover. A client built
anywhere else would silently keep talking to a demoted master.

``sync_client(url)`` and ``async_client(url)`` are the only constructors the
product code uses. (Sentinel support: see the resilience work; until then a
plain ``redis://`` / ``rediss://`` URL.)
"""

from __future__ import annotations

import redis
import redis.asyncio as aioredis


def sync_client(url: str) -> redis.Redis:
    """A blocking client for ``url`` (``redis://``, ``rediss://``)."""
    return redis.Redis.from_url(url)


def async_client(url: str) -> aioredis.Redis:
    """An asyncio client for ``url`` (``redis://``, ``rediss://``)."""
    return aioredis.Redis.from_url(url)
