"""Park a secret-bearing object in Redis and hand over only a random key."""

from __future__ import annotations

import json
import secrets
from typing import Any

KEY_PREFIX = "cairn:sealed:"
KEY_RANDOM_BYTES = 24  # 192 bits: unguessable, and short enough for a task argument
MIN_TTL_MS = 1


class SealedMissing(LookupError):
    """The parked object is gone: already taken, expired, or never parked (the key is not secret)."""


def _redis_key(key: str) -> str:
    return key if key.startswith(KEY_PREFIX) else KEY_PREFIX + key


def park(client: Any, obj: dict[str, Any], ttl_s: float) -> str:
    """Store ``obj`` (JSON) for ``ttl_s`` seconds under a fresh random key; return the key.

    The OAuth exchange's secrets must cross between bridge and pool task, but task arguments and
    results show in Flower and the result backend (S1): only the key travels, and the receiver
    reads-and-deletes it (``GETDEL``), so a secret is read at most once within its TTL.
    """
    key = KEY_PREFIX + secrets.token_urlsafe(KEY_RANDOM_BYTES)
    ttl_ms = max(MIN_TTL_MS, int(ttl_s * 1000))
    body = json.dumps(obj, separators=(",", ":"))
    if not client.set(key, body, px=ttl_ms, nx=True):  # a collision at 192 bits means a bug
        raise RuntimeError("sealed key collision")
    return key


def unpark(client: Any, key: str, *, missing_ok: bool = False) -> dict[str, Any] | None:
    """Read and delete the object parked under ``key`` (``GETDEL``: at most one reader).

    A missing key raises :class:`SealedMissing` naming the key (not its content),
    unless ``missing_ok`` (callers that only want the secret gone, e.g. the
    bridge dropping an untaken request), which returns None.
    """
    raw = client.getdel(_redis_key(str(key)))
    if raw is None:
        if missing_ok:
            return None
        raise SealedMissing(f"sealed object {key!r} is gone (taken, expired or never parked)")
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise SealedMissing(f"sealed object {key!r} is not an object")
    return value


def discard(client: Any, key: str) -> None:
    """Delete a parked object if it is still there (idempotent)."""
    client.delete(_redis_key(str(key)))
