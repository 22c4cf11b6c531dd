"""Single-flight Garmin logins: one per account in a process, one at a time per account across hosts."""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import redis
from redis.lock import Lock

log = logging.getLogger(__name__)

LOCK_PREFIX = "cairn:garmin:login:"  # + account id; the value is a random holder token, never a secret
# Far longer than a healthy login (sign-in page, login POST, two OAuth exchanges: well under a
# second), so only a holder that died leaves the key to expire.
LOCK_TTL_S = 60.0
# How long another host waits for the holder's login before it logs in itself (bounded: a hung holder
# must not stall the account's imports; the lock's TTL frees it later anyway).
WAIT_S = 20.0
POLL_S = 0.1  # how often a waiter looks whether the holder released the lock


class LoginGate:
    """Who may log in to an account now.

    In a process (the Garmin pool runs its jobs on threads, so one process serves a host), the
    account's lock (kept only while a thread uses it) makes every other thread of that account
    wait for the one logging in; they then find its session in the cache. Across hosts, a
    Redis key per account, set only if absent with a TTL, makes the others wait up to
    ``WAIT_S`` for the holder; then they log in themselves (their own process has no session
    to reuse), but not at the same moment, and only after re-reading the shared login window,
    which the holder's 429 marks spent. The key holds a random token: nothing about the login
    or its session. Without Redis (``client`` None, or Redis down) only the in-process lock applies.
    """

    def __init__(self, client: redis.Redis | None, *, wait_s: float = WAIT_S) -> None:
        self._redis = client
        self.wait_s = wait_s
        self._guard = threading.Lock()
        self._locks: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()

    def _lock(self, account_id: str) -> threading.Lock:
        with self._guard:
            lock = self._locks.get(account_id)
            if lock is None:
                lock = self._locks[account_id] = threading.Lock()
            return lock

    @contextlib.contextmanager
    def hold(self, account_id: str, cached: Callable[[], Any]) -> Iterator[Any]:
        """Yield the session another thread made meanwhile (``cached()``), else None with the gate held."""
        with self._lock(account_id):
            found = cached()
            if found is not None:
                yield found
                return
            held = self._acquire(account_id)
            try:
                yield None
            finally:
                self._release(held)

    def _acquire(self, account_id: str) -> Lock | None:
        """redis-py's lock on the account's key once this process holds it (its value a random token,
        released only by its holder); None when it gave up waiting or Redis did not answer."""
        if self._redis is None:
            return None
        lock = self._redis.lock(LOCK_PREFIX + account_id, timeout=LOCK_TTL_S, sleep=POLL_S,
                                blocking_timeout=self.wait_s)
        try:
            if lock.acquire():
                return lock
        except redis.RedisError as exc:
            log.warning("garmin login gate unavailable (%s): logging in without it", type(exc).__name__)
            return None
        log.info("garmin login for account %s: another instance still logging in after %.0fs; "
                 "logging in too", account_id, self.wait_s)
        return None

    @staticmethod
    def _release(lock: Lock | None) -> None:
        if lock is None:
            return
        with contextlib.suppress(redis.RedisError):  # not ours any more, or Redis away: the TTL frees it
            lock.release()
