"""Beat's scheduler: celery-redbeat, made to ride out Redis outages (invariant R1)."""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from celery.signals import beat_init
from redbeat import RedBeatScheduler
from redbeat.schedulers import LUA_EXTEND_TO_SCRIPT, acquire_distributed_beat_lock, get_redis
from redis.exceptions import LockError

from workers.outage import Outage
from workers.redisconn import sync_client

log = logging.getLogger("celery.beat")

REDBEAT_REDIS_ATTR = "redbeat_redis"  # where redbeat's get_redis() looks for a ready client
# How long setup may wait for Redis at start before beat gives up (a supervisor restarts it).
SETUP_RETRY_DEADLINE_S = 300.0


class ResilientRedBeatScheduler(RedBeatScheduler):
    """RedBeat that keeps or re-acquires its lock across Redis restarts instead of exiting.

    Stock ``tick()`` extends the lock first, and a ``ConnectionError`` or ``LockNotOwnedError``
    there escapes beat's loop. Here the client comes from ``workers.redisconn`` (follows a
    Sentinel failover), a Redis error in ``tick`` is one outage line and a backoff, and a lost
    lock is retaken without blocking with the static schedule re-installed (a Redis that lost
    its data lost the entries); while another beat holds it this one stands by. Entries due
    during an outage run once it is over (``last_run_at`` lives in Redis).
    """

    lock: Any  # RedBeat's lock (redis-py's Lock); None while another beat holds it

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        if getattr(app, REDBEAT_REDIS_ATTR, None) is None:
            # RedBeat needs str replies; the client follows Sentinel like the rest of the fleet.
            setattr(app, REDBEAT_REDIS_ATTR, sync_client(app.conf.redbeat_redis_url, decode_responses=True))
        self._outage = Outage.redis_loop("beat", log)
        super().__init__(app, *args, **kwargs)

    def setup_schedule(self) -> None:
        """Install the static entries, waiting (with backoff) for Redis if it is down at start."""
        waited = 0.0
        while True:
            try:
                super().setup_schedule()
                self._outage.ok()
                return
            except redis.RedisError as exc:
                delay = self._outage.failed("schedule setup", exc)
                if waited >= SETUP_RETRY_DEADLINE_S:
                    raise
                time.sleep(delay)
                waited += delay

    def tick(self, *args: Any, **kwargs: Any) -> float:
        try:
            if self.lock_key and self.lock is None and not self._try_acquire():
                self._outage.ok()
                return float(self.max_interval)  # another beat holds the lock: stand by
            interval = super().tick(*args, **kwargs)
        except LockError as exc:  # LockNotOwnedError: expired or wiped while Redis was away
            log.warning("beat: lost the RedBeat lock (%s); taking it again", type(exc).__name__)
            self.lock = None
            return 0.0
        except redis.RedisError as exc:
            return self._outage.failed("tick", exc)
        self._outage.ok()
        return float(interval)

    def maybe_due(self, entry: Any, **kwargs: Any) -> float:
        """RedBeat's, except that Redis failing while a due entry is advanced is the tick's outage.

        Advancing an entry (``reserve``) writes its last run to Redis before the task is sent, and
        RedBeat's ``maybe_due`` logs any error there as ``Message Error`` with a traceback and goes
        on: a Redis restart at that moment looked like a broken send. Raised instead, it reaches
        :meth:`tick` (one outage line, a backoff), and the entry, not advanced, is still due when
        Redis is back, so it runs then, once.
        """
        is_due, next_time_to_run = entry.is_due()
        if not is_due:
            return float(next_time_to_run)
        entry = self.reserve(entry)  # redis.RedisError: the tick's outage
        log.info("Scheduler: Sending due task %s (%s)", entry.name, entry.task)
        try:
            self.apply_async(entry, advance=False, **kwargs)
        except Exception as exc:  # as RedBeat: one failed send does not stop the schedule
            log.exception("Scheduler: Message Error: %s", exc)
        return float(next_time_to_run)

    def _ensure_connected(self) -> Any:
        """The broker connection for sending a due task, retried for ever as Celery's beat does,
        but each outage logged once (Celery's own handler logs an ERROR on every retry)."""
        def on_retry(exc: Exception, _interval: float) -> None:
            self._outage.failed("task send", exc)

        connection = self.connection.ensure_connection(on_retry, self.app.conf.broker_connection_max_retries)
        self._outage.ok()
        return connection

    def _try_acquire(self) -> bool:
        """Take the lock if free, as RedBeat's start-up hook does but without blocking."""
        client = get_redis(self.app)
        lock = client.lock(self.lock_key, timeout=self.lock_timeout, sleep=self.max_interval)
        lock.lua_extend = client.register_script(LUA_EXTEND_TO_SCRIPT)
        if not lock.acquire(blocking=False):
            return False
        log.info("beat: Acquired lock")
        self.lock = lock
        # Redis may have come back empty (the lock was lost with everything else): the static
        # entries live only in Redis, and RedBeat installs them only at start. Re-installing keeps
        # each surviving entry's last_run_at, so nothing runs twice.
        RedBeatScheduler.setup_schedule(self)
        return True

    def close(self) -> None:
        try:
            super().close()
        except (redis.RedisError, LockError) as exc:  # shutting down during an outage: the lock expires
            log.warning("beat: could not release the RedBeat lock (%s); it expires by itself",
                        type(exc).__name__)
            self.lock = None


beat_init.disconnect(acquire_distributed_beat_lock)


@beat_init.connect
def _acquire_lock_at_start(sender: Any = None, **kwargs: Any) -> None:
    """RedBeat's start-up lock, waiting while another beat holds it; Redis going away meanwhile is an
    outage of this beat (logged once, ``tick`` takes the lock when Redis is back), not an error."""
    try:
        acquire_distributed_beat_lock(sender, **kwargs)
    except redis.RedisError as exc:
        outage = getattr(getattr(sender, "scheduler", None), "_outage", None)
        if outage is None:  # a scheduler other than ours: say it the way Celery's handler would, minus the traceback
            log.warning("beat: could not take the RedBeat lock at start (%s)", type(exc).__name__)
        else:
            outage.failed("lock at start", exc)


SCHEDULER = f"{__name__}:{ResilientRedBeatScheduler.__qualname__}"


def install(app: Any) -> None:
    """``celery -A tasks beat`` runs this scheduler even without the Procfile's ``-S``."""
    app.conf.beat_scheduler = SCHEDULER
