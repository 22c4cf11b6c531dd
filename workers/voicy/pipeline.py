"""The Voicy job pipeline, free of Celery: claim, download, heartbeat, reap."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis

from workers.errors import JobError, RetryableJobError, StaleJobError
from workers.lease import LeaseKeeper, granted, new_token
from workers.logs import redact
from workers.transcribe.probe import media_seconds
from workers.voicy import grants
from workers.voicy.fleet import HeldJob, Stage
from workers.voicy.outcomes import LeaseLost, guarded, report_failure
from workers.voicy.runtime import QUEUED_LEASE_TTL_S, VoicyRuntime
from workers.voicy.telegram import download_to_store

log = logging.getLogger(__name__)

REAP_LOCK_KEY = "sy:voicy:reaper-lock"
REAP_LOCK_TTL_S = 30.0
WORKER_LOST = "worker lost before the media was stored"  # the reaper's failure when no media was stored


# --- claiming (used by the bridge) -------------------------------------------------------

def adopt_claim(rt: VoicyRuntime, job_id: str, *, attempts: int, language: str | None,
                stage: Stage = Stage.CLAIMED, media_key: str | None = None,
                slot: str | None = None) -> str:
    """Record a freshly claimed job as held and grant it, pending, to a new token; return the token.

    The first of a lease's steps (claim → grant → send → confirm → take → hand over → release):
    every step takes the lease first, so a duplicate delivery returns without touching Voicy
    (V2), and every grant is sent-then-confirmed, the reaper's too (``tasks.voicy.dispatch``).

    One Redis transaction (:meth:`Fleet.adopt`) also swaps the backlog
    reservation ``slot`` the claim was made under for the job. If it raises,
    whatever it may have written is undone (best effort) and the error
    re-raised: the caller must then hand the claim back to Voicy, since no
    record of ours will. The caller sends the task carrying the token and then
    calls :func:`confirm_grant`.
    """
    token = new_token()
    job = HeldJob(job_id=job_id, stage=stage, attempts=attempts, language=language, media_key=media_key)
    try:
        rt.fleet.adopt(job, slot=slot, gpu=stage is not Stage.CLAIMED, lease_key=rt.leases.key(job_id),
                       lease_value=granted(token), lease_ttl_s=rt.pending_grant_ttl_s)
    except Exception:
        _undo_adopt(rt, job_id, slot, token)
        raise
    return token


def _undo_adopt(rt: VoicyRuntime, job_id: str, slot: str | None, token: str) -> None:
    """Remove what a failed :func:`adopt_claim` may have written (the error may come after the write).

    Nobody else can hold this job yet (Voicy gave it to this claim alone), so
    forgetting it is safe; the grant is released only if it is still ours.
    """
    try:
        if slot:
            rt.fleet.cancel_backlog(slot)
        rt.fleet.forget(job_id)
        rt.leases.release(job_id, granted(token))
    except redis.RedisError as exc:  # a leftover record's pending grant expires; the reaper ends it
        log.warning("job %s: could not undo a failed adoption: %s", job_id, type(exc).__name__)


def confirm_grant(rt: VoicyRuntime, job_id: str, token: str) -> bool:
    """The task carrying ``token`` is in the broker now: keep its grant for ``QUEUED_LEASE_TTL_S``.

    False is normal when the task was quick and already took (or even ended)
    the job. It also happens when the send outlived the pending TTL: the reaper
    then recovers the job and the late task finds its grant gone and does nothing.
    """
    confirmed = rt.leases.confirm(job_id, token, QUEUED_LEASE_TTL_S)
    if not confirmed:
        log.debug("job %s: grant already taken, ended or expired before it was confirmed", job_id)
    return confirmed


# --- download --------------------------------------------------------------------------------

def run_download(rt: VoicyRuntime, job_id: str, token: str) -> str | None:
    """Download the job's media into the store; return the token granted (pending) to the gpu task."""
    lease_value = rt.leases.take(job_id, token, rt.lease_ttl_s)
    if lease_value is None:
        log.info("job %s: download already owned by another execution; skipping", job_id)
        return None

    def body(keeper: LeaseKeeper) -> str | None:
        started = time.monotonic()
        source = rt.client.source(job_id)
        key = download_to_store(source, rt.store, rt.telegram)
        if keeper.lost.is_set():
            raise LeaseLost(job_id)
        held = rt.fleet.get(job_id) or HeldJob(job_id=job_id)
        held.media_key, held.stage = key, Stage.DOWNLOADED
        if rt.settings.clip_batching:  # a gpu slot batches only what fits one window: say now
            held.duration_s = _media_seconds(rt, key)
        rt.fleet.update(held)
        # On the gpu set *before* Voicy calls the job ready: a bridge pass in between would find a free
        # slot and claim-ready the job's own ready state back from Voicy (tests/voicy/test_voicy_gpu_slot.py).
        rt.fleet.enter_gpu(job_id)
        rt.client.downloaded(job_id, rt.store.describe(key))
        next_token = new_token()
        if not rt.leases.hand_over(job_id, lease_value, next_token, rt.pending_grant_ttl_s):
            raise LeaseLost(job_id)
        log.info("job %s downloaded in %.2fs (attempt %s)", job_id,
                 time.monotonic() - started, held.attempts)
        return next_token

    return guarded(rt, job_id, lease_value, body)


def _media_seconds(rt: VoicyRuntime, key: str) -> float | None:
    """The stored media's length (``workers.transcribe.probe``); ``None`` if the store cannot say.

    Free with a local store; with S3 it reads the object back once, only while
    clip batching is on.
    """
    try:
        with rt.store.local_path(key) as path:
            return media_seconds(path)
    except JobError as exc:
        log.info("media length of %s unknown: %s", key, redact(str(exc)))
        return None


def refuse(rt: VoicyRuntime, job_id: str, token: str, why: str) -> bool:
    """A job task of a shape this release cannot read (``tasks.shapes``): hand the job back to Voicy.

    Under the task's own grant, as every step: a copy whose grant is gone does nothing (V2). The
    retryable failure (its text says why, and Voicy keeps it as the job's last error) has Voicy
    requeue the job, so a worker of the release that sent the task takes it again. False if the
    grant was not this task's.
    """
    lease_value = rt.leases.take(job_id, token, rt.lease_ttl_s)
    if lease_value is None:
        log.info("job %s: refused task no longer owns the job; skipping", job_id)
        return False

    def body(_keeper: LeaseKeeper) -> None:
        raise RetryableJobError(f"{why}; handed back for a worker of the release that sent it")

    guarded(rt, job_id, lease_value, body)
    return True


# --- heartbeats and recovery (beat) ----------------------------------------------------------

def heartbeat_held(rt: VoicyRuntime) -> int:
    """Heartbeat every held job whose lease is alive: a heartbeat means someone works on it.

    A stale 404 (Voicy failed the job, e.g. all of an unreachable chat's jobs,
    reference §3.5) does *not* forget the job: the live lease names a task that
    still holds it, and that task's own call will get the same 404 and
    :func:`finish` the job, deleting its media, which needs the fleet record.
    (Should the task die instead, the reaper ends it the same way.)
    """
    sent = 0
    for job_id in rt.fleet.held_ids():
        if not rt.leases.alive(job_id):
            continue
        try:
            rt.client.heartbeat(job_id)
            sent += 1
        except StaleJobError:
            log.info("job %s is gone at Voicy; its task will drop it and delete its media", job_id)
        except JobError as exc:
            log.warning("heartbeat for job %s failed: %s", job_id, redact(str(exc)))
    return sent


@dataclass
class Recovery:
    job_id: str
    token: str


def recover(rt: VoicyRuntime, job_id: str, token: str, *, no_media: str) -> Recovery | None:
    """The one recovery rule: media in the store → transcribe, else a retryable failure.

    For a held job nobody works on, ours again under a *pending* grant to
    ``token``: the reaper's (lease expired) and the bridge's (claim-ready after
    a restart, adopted with its media key). Media in the store: the job goes on
    the gpu set and is returned; the caller dispatches its transcription, which
    also completes a ``/downloaded`` that never landed (:func:`_enter_transcribing`).
    No media: a retryable ``failure`` saying ``no_media``, so Voicy requeues the
    job for a fresh download, and the job is forgotten.
    """
    held = rt.fleet.get(job_id)
    if held and held.media_key and rt.store.exists(held.media_key):
        rt.fleet.enter_gpu(job_id)
        return Recovery(job_id, token)
    report_failure(rt, job_id, RetryableJobError(no_media), granted(token))
    return None


def reap(rt: VoicyRuntime, broker: grants.BrokerScan | None = None) -> list[Recovery]:
    """Find held jobs whose lease expired (their worker died) and recover each one once (:func:`recover`).

    The grant is taken only if no lease exists. A reaper killed half-way
    leaves pending grants only, which expire so the next pass retries. A job
    that ended while the pass walked its list (no record any more) is skipped.
    With ``broker`` (the reap task passes it) confirmed grants are audited too:
    one whose task's message no worker will run is recovered the same way
    (:func:`_recover_stranded`).
    """
    if not rt.redis.set(REAP_LOCK_KEY, "1", nx=True, px=int(REAP_LOCK_TTL_S * 1000)):
        return []
    recoveries: list[Recovery] = []
    try:
        for job_id in rt.fleet.held_ids():
            if rt.leases.alive(job_id):
                continue
            if rt.fleet.get(job_id) is None:
                # Ended since the list was read: ``finish`` forgets the record *before* it releases the
                # lease, so a leaseless job without a record has ended, not lost its worker.
                rt.fleet.forget(job_id)
                continue
            token = new_token()
            if not rt.leases.grant(job_id, token, rt.pending_grant_ttl_s, only_if_absent=True):
                continue  # someone else recovered it in the meantime
            recovery = recover(rt, job_id, token, no_media=WORKER_LOST)
            if recovery is not None:
                log.warning("job %s: worker lost; redispatching transcription", job_id)
                recoveries.append(recovery)
        if broker is not None:
            recoveries += _recover_stranded(rt, broker)
    finally:
        rt.redis.delete(REAP_LOCK_KEY)
    return recoveries


def _recover_stranded(rt: VoicyRuntime, broker: grants.BrokerScan) -> list[Recovery]:
    """Recover each job whose confirmed grant no queued task will take (``workers.voicy.grants``).

    The grant is replaced by compare-and-set, only if it still names the
    stranded token: a task that took it meanwhile keeps its job, and the lost
    task, should it ever run, finds its grant gone and does nothing (V2).
    """
    recoveries: list[Recovery] = []
    for lost in grants.stranded(rt, broker):
        token = new_token()
        if not rt.leases.replace_grant(lost.job_id, lost.token, token, rt.pending_grant_ttl_s):
            continue  # taken, ended or recovered since the audit read it
        rt.redis.delete(grants.mark_key(lost.job_id))
        log.warning("job %s: grant stranded (%s); recovering", lost.job_id, lost.describe())
        recovery = recover(rt, lost.job_id, token, no_media=grants.STRANDED_TASK)
        if recovery is not None:
            log.warning("job %s: redispatching transcription", lost.job_id)
            recoveries.append(recovery)
    return recoveries
