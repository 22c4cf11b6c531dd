"""Per-job leases in Redis: the one authority on who may work on a job right now."""

from __future__ import annotations

import enum
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

import redis
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_before_delay, wait_exponential

from workers.outage import REDIS_UNAVAILABLE

log = logging.getLogger(__name__)

LEASE_PREFIX = "sy:lease:"
RENEWALS_PER_TTL = 3  # renew three times per TTL so one late renewal never loses the lease
ENDED_REMEMBERED = 1024  # leases a process remembers ending itself (one per job it ran, the latest)
FENCE_TIMEOUT_S = 30.0  # how long a fence waits for an unreachable Redis before it says "not ours"
FENCE_RETRY_S = 0.5
# A task waits this long for an unreachable Redis to take its grant (R1: a restart, a Sentinel
# failover, an outage of up to a minute). Giving up sooner would strand the job: its grant lives
# for the queued TTL (hours), and Celery has already acked the message that carried it.
TAKE_OUTAGE_WAIT_S = 300.0
TAKE_RETRY_INITIAL_S = 0.2
TAKE_RETRY_MAX_S = 5.0

# Swap ARGV[1] for ARGV[2]; finding ARGV[2] already there is success too, so a call retried after
# its reply was lost (the write landed, the connection dropped) does not mistake its own write for
# another owner's.
_TAKE = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or v == ARGV[2] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end
return 0
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_GRANT_UNLESS_RUNNING = """
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 8) == 'running:' then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


GRANTED_PREFIX = "granted:"
RUNNING_PREFIX = "running:"


class LeaseState(enum.Enum):
    """What a lease key says about its job right now (the only reading of a lease value)."""

    ABSENT = "absent"  # nobody owns the job: never granted, released, or expired with its owner
    GRANTED = "granted"  # handed to a queued task that has not started
    RUNNING = "running"  # one live execution renews it


@dataclass(frozen=True)
class LeaseView:
    """A lease value read once: its state and the token of the grant it belongs to."""

    state: LeaseState
    token: str | None = None

    def held_by(self, token: str | None) -> bool:
        """True when the lease belongs to the grant carrying ``token`` (granted or running)."""
        return token is not None and self.token == token


def view(value: bytes | str | None) -> LeaseView:
    """Classify a raw lease value (``GET`` of :meth:`Leases.key`), e.g. one read by an asyncio client.

    Callers never match the value's text themselves: the encoding belongs to this module.
    """
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if not value:
        return LeaseView(LeaseState.ABSENT)
    if value.startswith(GRANTED_PREFIX):
        return LeaseView(LeaseState.GRANTED, value[len(GRANTED_PREFIX):])
    if value.startswith(RUNNING_PREFIX):
        return LeaseView(LeaseState.RUNNING, value[len(RUNNING_PREFIX):].split(":", 1)[0])
    return LeaseView(LeaseState.RUNNING)  # unknown writer: treat as owned, never steal it


def new_token() -> str:
    """A fresh random lease token (not a secret: it only names one grant)."""
    return uuid.uuid4().hex


def granted(token: str) -> str:
    """The lease value of a grant to the queued task carrying ``token``."""
    return f"{GRANTED_PREFIX}{token}"


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class Leases:
    """Lease operations for one namespace (``voicy``, ``cairn``).

    Celery may deliver a task twice and a killed worker leaves no trace in Celery, so a lease
    key says who owns each job: ``granted:<token>`` (a queued task) or ``running:<token>:<id>``
    (one live execution, renewed by a :class:`LeaseKeeper`). A task takes a lease only by
    compare-and-set from its own grant, so a duplicate or superseded task does nothing (V2);
    a reaper that finds no lease knows the owner died or never got its task (V1).
    """

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self._r = client
        self._ns = namespace
        # Leases this process ended itself (released, handed over), so that a keeper still
        # renewing one does not mistake its absence for a loss. Bounded: only the latest matter.
        self._ended: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._ended_lock = threading.Lock()
        self._take = client.register_script(_TAKE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._grant_unless_running = client.register_script(_GRANT_UNLESS_RUNNING)

    def key(self, job_id: str) -> str:
        return f"{LEASE_PREFIX}{self._ns}:{job_id}"

    def grant(self, job_id: str, token: str, ttl_s: float, *, only_if_absent: bool = False) -> bool:
        """Give the job to the queued task carrying ``token``. With ``only_if_absent``, never steal."""
        ok = self._r.set(self.key(job_id), granted(token), px=_ms(ttl_s), nx=only_if_absent)
        return bool(ok)

    def grant_unless_running(self, job_id: str, token: str, ttl_s: float) -> bool:
        """Grant to ``token`` unless a task is running the job (then False: adopt it, never steal it).

        A stale grant of a dead sender is replaced: its queued task then finds the
        lease granted to another token and does nothing.
        """
        return bool(self._grant_unless_running(keys=[self.key(job_id)], args=[granted(token), _ms(ttl_s)]))

    def take(self, job_id: str, token: str, ttl_s: float, *,
             outage_wait_s: float = TAKE_OUTAGE_WAIT_S) -> str | None:
        """Start running the job if it is granted to ``token``; return the running value or None.

        An unreachable Redis is waited out (up to ``outage_wait_s``), not raised: the
        task carrying ``token`` has been acked already, so a take that fails on a
        dropped connection would leave the job granted, for the queued TTL, to a task
        that no longer exists. The retry uses the same running value, and the script accepts
        finding it: a take whose write landed before the connection dropped is still this
        execution's.
        """
        running = f"{RUNNING_PREFIX}{token}:{uuid.uuid4().hex}"
        # Only ``REDIS_UNAVAILABLE`` is waited out (no connection, no Sentinel master yet, a master
        # still loading or demoted to read-only); anything else is raised at once. ``stop_before_delay``:
        # no pause reaches past ``outage_wait_s``, and 0 is one attempt.
        attempts = Retrying(retry=retry_if_exception_type(REDIS_UNAVAILABLE),
                            wait=wait_exponential(multiplier=TAKE_RETRY_INITIAL_S, max=TAKE_RETRY_MAX_S),
                            stop=stop_before_delay(outage_wait_s), before_sleep=_take_waits(job_id, outage_wait_s),
                            reraise=True)
        for attempt in attempts:
            with attempt:
                taken = self._take(keys=[self.key(job_id)], args=[granted(token), running, _ms(ttl_s)])
        if attempt.retry_state.attempt_number > 1:
            log.info("job %s: Redis reachable again; lease %s", job_id, "taken" if taken else "not ours")
        return running if taken else None

    def replace_grant(self, job_id: str, token: str, new_token: str, ttl_s: float) -> bool:
        """Re-grant a job granted to ``token`` to ``new_token`` for ``ttl_s``, only if it still says so.

        The grant audit's compare-and-set (``workers.voicy.grants``): a task that took the
        grant meanwhile keeps it, and a late task carrying ``token`` finds it changed (V2).
        """
        return bool(self._take(keys=[self.key(job_id)], args=[granted(token), granted(new_token), _ms(ttl_s)]))

    def hand_over(self, job_id: str, running: str, token: str, ttl_s: float) -> bool:
        """Atomically pass a running lease to the next queued task (download → transcribe)."""
        return self._ending(job_id, running,
                            lambda: self._take(keys=[self.key(job_id)], args=[running, granted(token), _ms(ttl_s)]))

    def confirm(self, job_id: str, token: str, ttl_s: float) -> bool:
        """Phase two of a grant: extend it to ``ttl_s`` once the task carrying ``token`` is sent.

        The sender may be killed between granting and sending, so a grant starts with a short
        TTL and only a sent task's grant gets the long queued one: an unsent grant expires as
        quickly as a dead worker's running lease.

        Only a lease that still says ``granted:<token>`` is extended. A grant the
        task already took (running), one that expired and was re-granted by the
        reaper, or one that is gone is left exactly as it is; the answer is False.
        It is the compare-and-extend of :meth:`renew`, applied to the grant's value.
        """
        return self.renew(job_id, granted(token), ttl_s)

    def renew(self, job_id: str, value: str, ttl_s: float) -> bool:
        """Extend the lease to ``ttl_s`` if it still holds exactly ``value``."""
        return bool(self._renew(keys=[self.key(job_id)], args=[value, _ms(ttl_s)]))

    def release(self, job_id: str, value: str) -> bool:
        return self._ending(job_id, value, lambda: self._release(keys=[self.key(job_id)], args=[value]))

    def _ending(self, job_id: str, value: str, end: Callable[[], object]) -> bool:
        """Run ``end`` (a script that ends the lease ``value``), remembered as ended here *before* it runs.

        A keeper renewing on its own thread can reach Redis between the script's write and the
        script's reply: its renewal then finds the lease changed. Marked only after the reply, the
        end was not yet known here, and the keeper reported a loss that was this process's own end.
        The mark is taken back unless Redis answered that the end took place.
        """
        mark = (job_id, value)
        with self._ended_lock:
            self._ended[mark] = None
            while len(self._ended) > ENDED_REMEMBERED:
                self._ended.popitem(last=False)
        ended = False
        try:
            ended = bool(end())
        finally:
            if not ended:
                with self._ended_lock:
                    self._ended.pop(mark, None)
        return ended

    def ended_here(self, job_id: str, value: str) -> bool:
        """Whether this process released or handed over the lease ``value`` of ``job_id`` itself."""
        with self._ended_lock:
            return (job_id, value) in self._ended

    def reclaim(self, job_id: str, value: str, ttl_s: float) -> bool:
        """Set the lease back to ``value`` only if nobody holds it (``SET NX``): never steals."""
        return bool(self._r.set(self.key(job_id), value, px=_ms(ttl_s), nx=True))

    def holder(self, job_id: str) -> str | None:
        value = self._r.get(self.key(job_id))
        return value.decode() if isinstance(value, bytes) else value

    def state(self, job_id: str) -> LeaseView:
        return view(self._r.get(self.key(job_id)))

    def states(self, job_ids: list[str]) -> list[LeaseView]:
        """The leases of ``job_ids`` read in one round trip."""
        return [view(v) for v in self._r.mget([self.key(j) for j in job_ids])] if job_ids else []

    def states_with_ttl(self, job_ids: list[str]) -> list[tuple[LeaseView, int]]:
        """Each job's lease and its remaining life in ms (negative when absent), in one round trip."""
        if not job_ids:
            return []
        with self._r.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.get(self.key(job_id))
                pipe.pttl(self.key(job_id))
            raw = pipe.execute()
        return [(view(raw[i]), int(raw[i + 1])) for i in range(0, len(raw), 2)]

    def alive(self, job_id: str) -> bool:
        return bool(self._r.exists(self.key(job_id)))


def _take_waits(job_id: str, wait_s: float) -> Callable[[RetryCallState], None]:
    """A take's first failed attempt says, once, that it waits for Redis (tenacity's ``before_sleep``)."""
    def before_sleep(state: RetryCallState) -> None:
        if state.attempt_number == 1 and state.outcome is not None:
            log.warning("job %s: Redis unreachable (%s) when taking its lease; waiting up to %.0fs",
                        job_id, type(state.outcome.exception()).__name__, wait_s)
    return before_sleep


class LeaseKeeper:
    """Renews a running lease from a daemon thread while the task body runs.

    ``lost`` is set when a renewal finds the lease gone or changed: the task must
    stop without reporting, because someone else now owns the job. Not when the
    body ended it itself (released once the job is done, handed over to the next
    task, both inside the keeper's block): :meth:`Leases.ended_here` tells the two
    apart, and the keeper just stops.

    A renewal that fails because Redis is unreachable is "unknown", not lost (R1).
    With ``reclaim_after_outage`` a lease found *absent* by the first renewal after
    such a failure is set back (``SET NX``, never over another holder's value): it
    expired, or vanished with Redis's data, only because nobody could renew it, and
    the task still runs. Any other holder means the job was handed on: lost. The
    Cairn job task uses it (its bridge waits out the gap, ``bridges.cairn.execution``),
    so a Redis restart under a running job does not make the job run twice.
    """

    def __init__(self, leases: Leases, job_id: str, value: str, ttl_s: float, *,
                 reclaim_after_outage: bool = False) -> None:
        self._leases, self._job_id, self.value, self._ttl_s = leases, job_id, value, ttl_s
        self._reclaim = reclaim_after_outage
        self._unsure = False  # a renewal failed since the last one that succeeded
        self._check_lock = threading.Lock()
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{job_id}", daemon=True)

    def _run(self) -> None:
        interval = self._ttl_s / RENEWALS_PER_TTL
        while not self._stop.wait(interval):
            if not self.held():
                return

    def held(self) -> bool:
        """Renew now; False (and ``lost`` set) only when Redis answered that the lease is not ours."""
        if self.lost.is_set():
            return False
        with self._check_lock:
            try:
                if self._leases.renew(self._job_id, self.value, self._ttl_s):
                    self._unsure = False
                    return True
                if self._leases.ended_here(self._job_id, self.value):
                    return False  # the body released or handed it over while we still ran: done, not lost
                if self._reclaim and self._unsure and self._leases.reclaim(self._job_id, self.value, self._ttl_s):
                    log.warning("lease of job %s re-taken after a Redis outage", self._job_id)
                    self._unsure = False
                    return True
            except redis.RedisError as exc:  # transient: the next renewal may succeed
                if not self._unsure:
                    log.warning("lease renewal for job %s failed (%s); retrying", self._job_id, type(exc).__name__)
                self._unsure = True
                return True
        log.warning("lease lost for job %s", self._job_id)
        self.lost.set()
        return False

    def fence(self, timeout_s: float = FENCE_TIMEOUT_S) -> bool:
        """Before a step no one can undo (a result or a failure posted): is the lease ours *now*?

        ``held()`` answers "yes" while Redis is unreachable (R1: an outage is not a loss), and
        ``lost`` only reflects the last renewal. A host cut off the network for longer than the
        TTL has had its lease expire and, likely, its job handed on; if it posted on the heal
        before its next renewal, an execution that no longer owns the job would report it. So
        the fence renews now and says yes only when Redis answers: the lease holds our value,
        or is absent and is set back (``SET NX``: it expired with nobody after us, never over
        another holder). Unreachable Redis is retried until ``timeout_s``, then it is no: the
        lease has expired by then anyway, and the reaper, which sees Redis, recovers the job.
        """
        deadline = time.monotonic() + timeout_s
        while not self.lost.is_set():
            with self._check_lock:
                try:
                    if self._leases.renew(self._job_id, self.value, self._ttl_s):
                        self._unsure = False
                        return True
                    if self._leases.reclaim(self._job_id, self.value, self._ttl_s):
                        log.warning("lease of job %s had expired with nobody after it; taken back", self._job_id)
                        self._unsure = False
                        return True
                    log.warning("lease lost for job %s", self._job_id)
                    self.lost.set()
                    return False
                except redis.RedisError as exc:
                    if time.monotonic() >= deadline:
                        log.warning("lease of job %s unconfirmed for %.0fs (%s): not ours to report",
                                    self._job_id, timeout_s, type(exc).__name__)
                        return False
            time.sleep(FENCE_RETRY_S)  # Redis unreachable: nothing to await but its return
        return False

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing (idempotent): the job has ended for this execution, its lease released or left."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
