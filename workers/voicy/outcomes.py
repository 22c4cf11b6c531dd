"""How a Voicy job ends for the execution that holds its lease: result, failure, dropped or handed back."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import redis

from workers.errors import AuthError, JobError, StaleJobError
from workers.lease import LeaseKeeper
from workers.logs import describe, redact
from workers.voicy.runtime import VoicyRuntime

log = logging.getLogger(__name__)

T = TypeVar("T")

# Redis itself unreachable (a restart, a failover), as opposed to a command it refused.
REDIS_AWAY = (redis.ConnectionError, redis.TimeoutError)


class LeaseLost(StaleJobError):
    """Our lease was taken over while we worked: stop without reporting anything."""


def finish(rt: VoicyRuntime, job_id: str, lease_value: str | None) -> None:
    """The job ended for us: delete its media and every fleet record."""
    held = rt.fleet.get(job_id)
    if held and held.media_key:
        try:
            rt.store.delete(held.media_key)
        except Exception as exc:  # media cleanup must not turn a success into a failure
            log.warning("could not delete media for job %s: %s", job_id, redact(str(exc)))
    rt.fleet.forget(job_id)
    if lease_value:
        rt.leases.release(job_id, lease_value)


def report_failure(rt: VoicyRuntime, job_id: str, exc: BaseException, lease_value: str | None) -> None:
    """Post ``failure`` with the right ``retryable`` flag, then forget the job."""
    retryable = exc.retryable if isinstance(exc, JobError) else True
    message = redact(str(exc)) or type(exc).__name__
    log.warning("job %s failed (retryable=%s): %s", job_id, retryable, message)
    try:
        rt.client.failure(job_id, message, retryable=retryable)
    except StaleJobError:
        log.info("job %s no longer ours while reporting failure", job_id)
    finish(rt, job_id, lease_value)


def hand_back(rt: VoicyRuntime, job_id: str, lease_value: str) -> bool:
    """The process is exiting mid-job: release the lease so the reaper recovers the job *now*.

    Only called while ``SystemExit`` unwinds the task, i.e. when this execution
    can no longer go on, so releasing cannot let two executions overlap (V2).
    The fleet records stay: the reaper needs them to redispatch the
    transcription (media in the store) or report a retryable failure (none).
    Without this the job waits a full lease TTL before the reaper sees it.
    """
    try:
        released = rt.leases.release(job_id, lease_value)
    except redis.RedisError as exc:  # the lease then simply expires: recovery is only slower
        log.warning("job %s: could not hand back the lease: %s", job_id, exc)
        return False
    if released:
        log.warning("job %s: worker shutting down mid-job; handed back for recovery", job_id)
    return released


def settle(rt: VoicyRuntime, job_id: str, lease_value: str, exc: Exception, keeper: LeaseKeeper) -> None:
    """End the job after ``exc`` stopped its work: the one mapping from an error to an outcome.

    Every step under a lease (download, transcription, one job of a batch) ends here, so the
    rules are written once (V1).

    ``keeper`` renews the job's lease (it says whether the lease was lost, and
    fences it before a failure is posted). ``AuthError`` is re-raised after
    logging (the task fails, the lease expires, the reaper retries later);
    every other error ends here.
    """
    if isinstance(exc, LeaseLost) or (isinstance(exc, StaleJobError) and keeper.lost.is_set()):
        # Our lease was taken over first: the new owner holds the job and its media
        # (e.g. it completed the /downloaded handshake before we could); leave both to it.
        log.warning("job %s: lease lost, leaving the job to its new owner", job_id)
    elif isinstance(exc, StaleJobError):
        log.info("job %s is no longer ours at Voicy; dropping it", job_id)
        finish(rt, job_id, lease_value)
    elif isinstance(exc, AuthError):
        # Nothing we post would be accepted; the lease expires and the reaper retries later.
        log.error("Voicy rejected the worker token (VOICY_WORKER_TOKEN invalid or disabled)")
        raise exc
    elif isinstance(exc, REDIS_AWAY):
        # Not the job's failure: posting one would make Voicy requeue a job whose records we still hold,
        # and raising it would have Celery log an error and a traceback. The records stay; once Redis is
        # back the lease expires and the reaper recovers the job, as when its worker dies.
        log.warning("job %s: Redis unavailable (%s); left for the reaper", job_id, describe(exc))
    elif not keeper.fence():  # a failure requeues the job at Voicy: not ours to post once handed on
        log.warning("job %s: lease lost, leaving the job to its new owner (%s)", job_id,
                    redact(str(exc)) or type(exc).__name__)
    else:
        report_failure(rt, job_id, exc, lease_value)


def guarded(rt: VoicyRuntime, job_id: str, lease_value: str, body: Callable[[LeaseKeeper], T]) -> T | None:
    """Run ``body(keeper)`` under a renewed lease and map every failure to one outcome (:func:`settle`).

    ``SystemExit`` means the pool process is being shut down under us: Celery's
    cold shutdown (``REMAP_SIGTERM=SIGQUIT``, after ``worker_soft_shutdown_timeout``)
    cancels the task with the terminate signal, and a SIGTERM sent to the child
    itself (Heroku signals every process of the dyno) does the same; billiard turns
    either into ``SystemExit`` in the task. We post nothing (the job is not failed)
    and hand it back instead (:func:`hand_back`).
    """
    with LeaseKeeper(rt.leases, job_id, lease_value, rt.lease_ttl_s) as keeper:
        try:
            return body(keeper)
        except SystemExit:
            hand_back(rt, job_id, lease_value)
            raise
        except Exception as exc:
            settle(rt, job_id, lease_value, exc, keeper)
            return None
