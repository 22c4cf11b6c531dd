"""Single-flight Garmin logins: one per account in a process, one at a time per account across hosts."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import redis

log = logging.getLogger(__name__)

LOCK_PREFIX = "cairn:garmin:login:"  # + account id; the value is a random holder token, never a secret
# Longer than a whole login (sign-in page, login POST, two OAuth exchanges, each under the 30 s request
# timeout in the worst case is more, but a healthy one is well under a second): a holder that died frees it.
LOCK_TTL_S = 60.0
# How long another host waits for the holder's login before it logs in itself (bounded: a hung holder
# must not stall the account's imports; the lock's TTL frees it later anyway).
WAIT_S = 20.0
POLL_S = 0.1  # how often a waiter looks whether the holder released the lock
# Release only our own lock: a holder whose TTL ran out must not delete the next holder's.
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


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
            token = self._acquire(account_id)
            try:
                yield None
            finally:
                self._release(account_id, token)

    def _acquire(self, account_id: str) -> str | None:
        """The holder token once this process holds the account's key; None when it gave up waiting."""
        if self._redis is None:
            return None
        token, key = uuid.uuid4().hex, LOCK_PREFIX + account_id
        deadline = time.monotonic() + self.wait_s
        try:
            while not self._redis.set(key, token, nx=True, px=int(LOCK_TTL_S * 1000)):
                if time.monotonic() >= deadline:
                    log.info("garmin login for account %s: another instance still logging in after %.0fs; "
                             "logging in too", account_id, self.wait_s)
                    return None
                time.sleep(POLL_S)
        except redis.RedisError as exc:
            log.warning("garmin login gate unavailable (%s): logging in without it", type(exc).__name__)
            return None
        return token

    def _release(self, account_id: str, token: str | None) -> None:
        if self._redis is None or token is None:
            return
        with contextlib.suppress(redis.RedisError):  # the TTL frees it anyway
            self._redis.eval(_RELEASE, 1, LOCK_PREFIX + account_id, token)
