"""Running an admitted job in the provider pool, or adopting the task a dead bridge left running."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from kombu.exceptions import OperationalError
from pydantic import ValidationError

from bridges.cairn.admission import DeliveryMeta
from bridges.cairn.results import TaskResults, TaskWatch
from bridges.cairn.settle import Held
from workers.cairn import outcomes
from workers.cairn.disposition import (
    HANDOVER_NAK_DELAY_S,
    LOST_TASK_NAK_DELAY_S,
    REDIS_DOWN_NAK_DELAY_S,
    TASK_FAILURE_NAK_DELAY_S,
    Disposition,
    nak,
)
from workers.cairn.outcomes import AsyncOutcomeLedger
from workers.lease import Leases, LeaseState, granted, new_token, view
from workers.outage import REDIS_UNAVAILABLE, Outage, backoff_s

log = logging.getLogger(__name__)

LEASE_CHECK_INTERVAL_S = 1.0  # how often a waiting message looks at its task's lease
ADOPTED_POLL_INTERVAL_S = 1.0  # how often an adopted task's ledger entry and lease are read
LOST_TASK_GRACE_S = 3.0  # lease gone: the result may still be on its way (released just before return)
GONE_POLL_INTERVAL_S = 0.5  # within the grace, how often the stored result and the ledger are read
# A task that lived through a Redis outage could not renew its lease: the lease may have
# expired (or vanished with Redis's data) while the task still runs and is about to record
# its outcome (its ledger write retries through the outage). Gone within this long after an
# outage is not yet "lost": the grace grows by the lease TTL and one backoff step.
POST_OUTAGE_EXTRA_GRACE_S = 5.0
# kombu's "broker unreachable" on send
DISPATCH_UNAVAILABLE: tuple[type[BaseException], ...] = (*REDIS_UNAVAILABLE, OperationalError)
REVOKED = "REVOKED"  # Celery's state of a task revoked before it ran (start deadline, operator)
SUCCESS = "SUCCESS"

SendJob = Callable[[str, dict[str, Any], dict[str, Any], str], None]  # (kind, job, meta, task_id)


class Shutdown:
    """The bridge's stop state as the waiters see it: stopping, and when the grace is over."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.deadline = float("inf")

    @property
    def stopping(self) -> bool:
        return self.event.is_set()

    def begin(self, grace_s: float) -> None:
        if not self.event.is_set():
            self.deadline = time.monotonic() + grace_s
            self.event.set()

    def grace_over(self) -> bool:
        return self.event.is_set() and time.monotonic() > self.deadline


def disposition_from_meta(meta: dict[str, Any]) -> Disposition:
    """The task's returned disposition; a task that raised is a delayed, failed NAK, one that
    was revoked before it ran is a delayed NAK that did not fail."""
    status = meta.get("status")
    if status == SUCCESS:
        try:
            return Disposition.model_validate(meta.get("result"))
        except ValidationError:
            return nak(TASK_FAILURE_NAK_DELAY_S, reason="task returned no valid disposition")
    return nak(TASK_FAILURE_NAK_DELAY_S, reason=f"task ended {status}", failure=status != REVOKED)


def job_task_prefix(pool: str) -> str:
    """How every ``cairn.job`` task id of the pool starts (``cairn-<pool>-<seq>-d<n>-…``): Flower shows
    the pool at a glance, and the bridge hears all their results through one pattern (``results``)."""
    return f"cairn-{pool}-" if pool else "cairn-"


class Execution:
    """Dispatches admitted jobs and waits for their outcome; adopts orphaned running tasks.

    A lease, stored-result or ledger read that fails is *unknown*, never "gone": the message
    stays held and the read is retried, reported to an :class:`~workers.outage.Outage` (R1).
    A message that arrives while Redis is down can be neither granted nor queued: it is NAKed
    ``REDIS_DOWN_NAK_DELAY_S`` without counting as a failure.
    """

    def __init__(self, send_job: SendJob, results: TaskResults, leases: Leases, aredis: Any,
                 start_deadline_s: float, shutdown: Shutdown, *, redis_outage: Outage | None = None,
                 lease_ttl_s: float = 0.0, pool: str = "") -> None:
        self._send_job, self._results, self._leases = send_job, results, leases
        self._r = aredis  # redis.asyncio client: lease and ledger reads on the event loop
        self._ledger = AsyncOutcomeLedger(aredis)
        self._start_deadline_s, self._shutdown = start_deadline_s, shutdown
        self._redis = redis_outage or Outage("Redis")
        self._post_outage_grace_s = lease_ttl_s + LOST_TASK_GRACE_S + POST_OUTAGE_EXTRA_GRACE_S
        self._task_prefix = job_task_prefix(pool)

    # ------------------------------------------------------------------ dispatch
    async def dispatch(self, held: Held, meta: DeliveryMeta, payload: dict[str, Any]) -> Disposition:
        """Grant the lease to a fresh token (unless a task runs it), send one ``cairn.job``, await it.

        Every ``LEASE_CHECK_INTERVAL_S`` the lease is read: granted and not taken within
        ``CAIRN_TASK_START_DEADLINE_S`` (or stopping) → revoke and NAK, no failure; running with
        our token → the task lives; gone → :meth:`_gone`.
        """
        held.token = token = new_token()
        key = meta.key
        task_id = f"{self._task_prefix}{meta.seq}-d{meta.delivered}-{uuid.uuid4().hex[:8]}"  # seq, delivery
        task_meta = {**key.as_meta(), "delivery": meta.delivered, "subject": meta.subject, "lease_token": token}
        try:
            watch = await self._results.watch(task_id)
        except REDIS_UNAVAILABLE as exc:
            self._redis.failed("result subscription", exc)
            return nak(REDIS_DOWN_NAK_DELAY_S, reason="no Redis: not dispatched", failure=False)
        try:
            try:
                sent = await asyncio.to_thread(self._grant_and_send, meta, payload, task_meta, task_id)
            except DISPATCH_UNAVAILABLE as exc:
                # Granted or not, no task carries the token for sure: a grant alone is replaced by the
                # next delivery's; a task that did get queued finds the lease re-granted and skips.
                self._redis.failed("lease grant / task send", exc)
                return nak(REDIS_DOWN_NAK_DELAY_S, reason="no Redis: not dispatched", failure=False)
            self._redis.ok()
            if not sent:  # a task runs it already (the lease turned running since admission read it)
                return await self.adopt(held, meta)
            return await self._await_task(held, meta, watch)
        finally:
            await self._results.forget(watch)

    def _grant_and_send(self, meta: DeliveryMeta, payload: dict[str, Any], task_meta: dict[str, Any],
                        task_id: str) -> bool:
        """Grant the lease, then queue the task that carries its token (one worker-thread hop:
        both are blocking client calls, and this runs for every message)."""
        if not self._leases.grant_unless_running(meta.key.id, str(task_meta["lease_token"]),
                                                 self._start_deadline_s):
            return False
        self._send_job(meta.kind, payload, task_meta, task_id)
        return True

    async def _await_task(self, held: Held, meta: DeliveryMeta, watch: TaskWatch) -> Disposition:
        lease_key = self._leases.key(meta.key.id)
        while True:
            done, _ = await asyncio.wait({watch.done}, timeout=LEASE_CHECK_INTERVAL_S)
            if done:
                return disposition_from_meta(watch.done.result())
            try:
                lease = view(await self._r.get(lease_key))
                self._redis.ok()
            except REDIS_UNAVAILABLE as exc:  # unknown, not gone: keep waiting (the result may still come)
                self._redis.failed("lease read", exc)
                lease = None
            if lease is None:
                pass
            elif lease.state is LeaseState.RUNNING and lease.held_by(held.token):
                held.running = True
            elif lease.state is LeaseState.GRANTED and lease.held_by(held.token):
                if self._shutdown.stopping or time.monotonic() - held.arrived > self._start_deadline_s:
                    try:
                        revoked = await asyncio.to_thread(self._leases.release, meta.key.id,
                                                          granted(str(held.token)))
                    except REDIS_UNAVAILABLE as exc:
                        self._redis.failed("lease release", exc)
                        continue
                    if revoked:
                        why = "shutting down" if self._shutdown.stopping else "task not started in time"
                        return nak(HANDOVER_NAK_DELAY_S, reason=f"{why}; revoked the queued task", failure=False)
                    continue  # it was taken just now
            else:
                return await self._gone(held, meta, watch)
            if self._shutdown.grace_over():
                return nak(HANDOVER_NAK_DELAY_S, reason="shutdown grace over; handing the job to another instance",
                           failure=False)

    async def _gone(self, held: Held, meta: DeliveryMeta, watch: TaskWatch) -> Disposition:
        """The lease is gone: the result may be on its way, stored, or recorded; else the task is lost.

        Within the grace the stored result and the ledger are read every
        ``GONE_POLL_INTERVAL_S``. A read that fails (Redis down) proves nothing:
        the grace starts again once Redis answers, and after an outage it is
        longer (``POST_OUTAGE_EXTRA_GRACE_S``), because the lease of a live task
        may have expired only because it could not be renewed.
        """
        grace_s = self._post_outage_grace_s if self._redis.recently(self._post_outage_grace_s) else LOST_TASK_GRACE_S
        deadline = time.monotonic() + grace_s
        while True:
            done, _ = await asyncio.wait({watch.done}, timeout=GONE_POLL_INTERVAL_S)
            if done:
                return disposition_from_meta(watch.done.result())
            try:
                stored = await self._results.stored(watch.task_id)
                recorded = await self._ledger.get(meta.key)
                self._redis.ok()
            except REDIS_UNAVAILABLE as exc:  # unknown: never "lost" on a failed read
                self._redis.failed("stored result / ledger read", exc)
                if self._shutdown.grace_over():
                    return nak(HANDOVER_NAK_DELAY_S, reason="shutdown grace over; no Redis", failure=False)
                deadline = time.monotonic() + self._post_outage_grace_s
                continue
            if stored is not None and stored.get("status") in (SUCCESS, "FAILURE", REVOKED):
                log.info("seq %d: result read from the backend (its pub/sub message was missed)", meta.seq)
                return disposition_from_meta(stored)
            if recorded is not None:
                log.info("seq %d: outcome read from the ledger", meta.seq)
                return recorded
            if time.monotonic() >= deadline or self._shutdown.grace_over():
                break
        # A task lost mid-run failed (a job that kills its worker every time must end
        # in a term); one that never started did not.
        why = "lease expired: task lost" if held.running else "task never started"
        return nak(LOST_TASK_NAK_DELAY_S if held.running else HANDOVER_NAK_DELAY_S, reason=why, failure=held.running)

    # ------------------------------------------------------------------ adopt
    async def adopt(self, held: Held, meta: DeliveryMeta) -> Disposition:
        """Wait for the task a dead bridge sent (its lease runs) instead of running the job twice.

        The ledger and the lease are polled together (one ``MGET``; the task records its outcome
        before releasing its lease) until the outcome is recorded and applied, or the lease is
        gone without one: the task died, a failed delivery. Adoptions are rare, so a poll is
        cheaper than a channel per message.
        """
        held.running = True  # it was running when we found it: vanishing without an outcome is a failure
        key = meta.key
        log.info("%s seq %d (delivery %d): adopted the running task of an earlier delivery",
                 meta.kind, meta.seq, meta.delivered)
        attempt = 0
        absent_since: float | None = None
        while True:
            try:
                raw_outcome, raw_lease = await self._r.mget(outcomes.ledger_key(key), self._leases.key(key.id))
                self._redis.ok()
                attempt = 0
            except REDIS_UNAVAILABLE as exc:  # unknown: keep the message, read again after a backoff
                self._redis.failed("adopted task's ledger / lease read", exc)
                if self._shutdown.grace_over():
                    return nak(HANDOVER_NAK_DELAY_S, reason="shutdown grace over; the adopted task is handed on",
                               failure=False)
                await asyncio.sleep(backoff_s(attempt))
                attempt += 1
                continue
            recorded = outcomes.decode(raw_outcome)
            if recorded is not None:
                log.info("%s seq %d: the adopted task's outcome is %s", meta.kind, meta.seq, recorded.action)
                return recorded
            if view(raw_lease).state is LeaseState.ABSENT:
                # Gone right after an outage may be a live task that could not renew: wait for its record.
                absent_since = absent_since if absent_since is not None else time.monotonic()
                if (not self._redis.recently(self._post_outage_grace_s)
                        or time.monotonic() - absent_since > self._post_outage_grace_s):
                    return nak(LOST_TASK_NAK_DELAY_S, reason="adopted task lost without an outcome", failure=True)
            else:
                absent_since = None
            if self._shutdown.grace_over():
                return nak(HANDOVER_NAK_DELAY_S, reason="shutdown grace over; the adopted task is handed on",
                           failure=False)
            await asyncio.sleep(ADOPTED_POLL_INTERVAL_S)
