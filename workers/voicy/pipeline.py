"""The Voicy job pipeline, free of Celery: download, transcribe, heartbeat, reap.

Task functions in ``tasks/voicy.py`` call these and dispatch the next step.
Every step first *takes* the job's lease (``workers.lease``): a duplicate
delivery, or a task whose job was recovered elsewhere, finds the lease in
another state and returns without touching Voicy (V2). Every outcome ends the
job exactly one way (V1): result posted, failure posted (Voicy requeues a
retryable one), or handed back to the reaper by letting the lease expire (a
killed process) or releasing it (a process shut down mid-job, :func:`hand_back`).

A job's lease, from claim to result:

1. the bridge claims it and :func:`adopt_claim` grants it to a new token with a
   *pending* TTL (one lease TTL, ``VOICY_WORKER_LEASE_TTL_MS``);
2. the download task carrying that token is sent, then :func:`confirm_grant`
   extends the grant to ``QUEUED_LEASE_TTL_S`` (the task may wait in the broker);
3. :func:`run_download` takes it (``running``, renewed while it works) and hands
   it over to the transcription's token, pending again, until that task is sent
   and the grant confirmed;
4. :func:`run_transcription` takes it, posts the result and releases it.

Every grant is sent-then-confirmed the same way, the reaper's too
(``tasks.voicy.dispatch``). A process killed between a grant and its send
leaves only a pending grant, which expires within a lease TTL like a dead
worker's running lease, so the reaper (:func:`reap`) recovers the job instead
of finding it granted for hours to a task that does not exist.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis

from workers.errors import AuthError, JobError, PermanentJobError, RetryableJobError, StaleJobError
from workers.lease import LeaseKeeper, Leases, granted, new_token
from workers.logs import redact
from workers.redisconn import sync_client
from workers.transcribe.engine import get_engine
from workers.transcribe.results import Transcript
from workers.voicy.bodies import transcript_body
from workers.voicy.client import VoicyClient
from workers.voicy.fleet import Fleet, HeldJob, Stage
from workers.voicy.media_store import MediaStore, media_store_from_url
from workers.voicy.progress import ProgressThrottle
from workers.voicy.settings import VoicySettings, load_voicy_settings
from workers.voicy.telegram import download_to_store

log = logging.getLogger(__name__)

LEASE_NAMESPACE = "voicy"
QUEUED_LEASE_TTL_S = 6 * 3600.0  # a queued task is safe in the broker; only a taken one can be lost
# A grant whose task is not sent yet lives this many lease TTLs: as long as a dead worker's
# running lease, so a process killed between granting and sending is recovered as quickly.
PENDING_GRANT_LEASE_TTLS = 1.0
REAP_LOCK_KEY = "sy:voicy:reaper-lock"
REAP_LOCK_TTL_S = 30.0
WORKER_LOST = "worker lost before the media was stored"  # the reaper's failure when no media was stored


class LeaseLost(StaleJobError):
    """Our lease was taken over while we worked: stop without reporting anything."""


@dataclass
class VoicyRuntime:
    """Everything one process needs for Voicy work; built once per process, after fork."""

    settings: VoicySettings
    client: VoicyClient
    store: MediaStore
    fleet: Fleet
    leases: Leases
    redis: redis.Redis

    @classmethod
    def from_env(cls, redis_url: str) -> VoicyRuntime:
        settings = load_voicy_settings()
        client = sync_client(redis_url)
        return cls(settings=settings, client=VoicyClient.from_settings(settings),
                   store=media_store_from_url(settings.media_store), fleet=Fleet(client),
                   leases=Leases(client, LEASE_NAMESPACE), redis=client)

    @property
    def lease_ttl_s(self) -> float:
        return self.settings.lease_ttl_ms / 1000.0

    @property
    def pending_grant_ttl_s(self) -> float:
        """TTL of a grant until :func:`confirm_grant` (its task not sent yet)."""
        return self.lease_ttl_s * PENDING_GRANT_LEASE_TTLS


# --- claiming (used by the bridge) -------------------------------------------------------

def adopt_claim(rt: VoicyRuntime, job_id: str, *, attempts: int, language: str | None,
                stage: Stage = Stage.CLAIMED, media_key: str | None = None,
                slot: str | None = None) -> str:
    """Record a freshly claimed job as held and grant it, pending, to a new token; return the token.

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


# --- outcomes ------------------------------------------------------------------------------

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


def _guarded(rt: VoicyRuntime, job_id: str, lease_value: str, body) -> object:  # type: ignore[no-untyped-def]
    """Run ``body(keeper)`` under a renewed lease and map every failure to one outcome.

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
        except LeaseLost:
            log.warning("job %s: lease lost, leaving the job to its new owner", job_id)
            return None
        except StaleJobError:
            if keeper.lost.is_set():
                # Our lease was taken over first: the new owner holds the job and its media
                # (e.g. it completed the /downloaded handshake before we could); leave both to it.
                log.warning("job %s: lease lost, leaving the job to its new owner", job_id)
                return None
            log.info("job %s is no longer ours at Voicy; dropping it", job_id)
            finish(rt, job_id, lease_value)
            return None
        except AuthError:
            # Nothing we post would be accepted; the lease expires and the reaper retries later.
            log.error("Voicy rejected the worker token (VOICY_WORKER_TOKEN invalid or disabled)")
            raise
        except Exception as exc:
            if not keeper.fence():  # a failure requeues the job at Voicy: not ours to post once handed on
                log.warning("job %s: lease lost, leaving the job to its new owner (%s)", job_id,
                            redact(str(exc)) or type(exc).__name__)
                return None
            report_failure(rt, job_id, exc, lease_value)
            return None


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
        key = download_to_store(source, rt.store, rt.settings)
        if keeper.lost.is_set():
            raise LeaseLost(job_id)
        held = rt.fleet.get(job_id) or HeldJob(job_id=job_id)
        held.media_key, held.stage = key, Stage.DOWNLOADED
        rt.fleet.update(held)
        # On the gpu set *before* Voicy calls the job ready: a bridge pass in between would find a free
        # slot and claim-ready the job's own ready state back from Voicy (tests/test_voicy_gpu_slot.py).
        rt.fleet.enter_gpu(job_id)
        rt.client.downloaded(job_id, rt.store.describe(key))
        next_token = new_token()
        if not rt.leases.hand_over(job_id, lease_value, next_token, rt.pending_grant_ttl_s):
            raise LeaseLost(job_id)
        log.info("job %s downloaded in %.2fs (attempt %s)", job_id,
                 time.monotonic() - started, held.attempts)
        return next_token

    return _guarded(rt, job_id, lease_value, body)  # type: ignore[return-value]


# --- transcription -----------------------------------------------------------------------------

def run_transcription(rt: VoicyRuntime, job_id: str, token: str) -> bool:
    """Transcribe the stored media, streaming progress, then post the result. True if posted."""
    lease_value = rt.leases.take(job_id, token, rt.lease_ttl_s)
    if lease_value is None:
        log.info("job %s: transcription already owned by another execution; skipping", job_id)
        return False
    rt.fleet.leave_backlog(job_id)

    def body(keeper: LeaseKeeper) -> bool:
        held = rt.fleet.get(job_id)
        if held is None or not held.media_key or not rt.store.exists(held.media_key):
            raise RetryableJobError("downloaded media is missing from the media store")
        _enter_transcribing(rt, job_id, held.media_key)
        held.stage = Stage.TRANSCRIBING
        rt.fleet.update(held)
        engine = get_engine(rt.settings)
        throttle = ProgressThrottle.from_settings(rt.settings)
        started = time.monotonic()

        def on_progress(partial: Transcript) -> None:
            if keeper.lost.is_set():
                raise LeaseLost(job_id)
            if throttle.should_send(partial.text):
                try:
                    rt.client.progress(job_id, transcript_body(partial, rt.settings.engine, engine.metadata))
                except (RetryableJobError, PermanentJobError) as exc:
                    log.warning("job %s: progress not stored: %s", job_id, redact(str(exc)))

        with rt.store.local_path(held.media_key) as path:
            transcript = engine.transcribe(path, language=held.language, on_segment=on_progress)
        if not keeper.fence():  # the result is final at Voicy: only the lease's owner may post it
            raise LeaseLost(job_id)
        rt.client.result(job_id, transcript_body(transcript, rt.settings.engine, engine.metadata))
        log.info("job %s transcribed in %.2fs (%.1fs of audio, %d parts)", job_id,
                 time.monotonic() - started, transcript.duration or 0.0, len(transcript.parts))
        try:
            finish(rt, job_id, lease_value)
        except redis.RedisError as exc:  # the job is done at Voicy: nothing to fail, only records to clear
            log.warning("job %s: result posted; its records wait for Redis (%s), the reaper clears them",
                        job_id, redact(f"{type(exc).__name__}: {exc}"))
        return True

    return bool(_guarded(rt, job_id, lease_value, body))


def _enter_transcribing(rt: VoicyRuntime, job_id: str, media_key: str) -> None:
    """``POST /transcribe``, after finishing whatever step a lost execution left undone.

    A 404 does not always mean the job is gone; ``GET /jobs/:id`` (ours and
    active, else 404 too) says what it is at Voicy:

    * ``transcribing``/``processing``: claim-ready, or a killed earlier execution
      of this transcription, already moved it: carry on;
    * ``downloading``: the download stored the media but its ``/downloaded`` never
      landed (the io process was killed mid-call, or Voicy stayed down past the
      retry budget and the ``/failure`` post failed too). Voicy reaps no
      downloading job (reference §3.2), so unless we finish the handshake here the
      job stays downloading for ever (V1): post ``/downloaded`` for our stored
      media, then ``/transcribe``;
    * ``ready``: someone posted ``/downloaded`` between the two calls: transcribe.
    """
    try:
        rt.client.transcribe(job_id)
        return
    except StaleJobError:
        job = rt.client.get_job(job_id)  # raises StaleJobError when it is really gone
    if job.status in ("transcribing", "processing"):
        return
    if job.status == "downloading":
        log.warning("job %s: Voicy never recorded /downloaded; completing the handshake", job_id)
        job = rt.client.downloaded(job_id, rt.store.describe(media_key))
    if job.status != "ready":
        raise StaleJobError(f"job {job_id} is {job.status} at Voicy")
    rt.client.transcribe(job_id)


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


def reap(rt: VoicyRuntime) -> list[Recovery]:
    """Find held jobs whose lease expired (their worker died) and recover each one once (:func:`recover`).

    The grant is taken only if no lease exists. A reaper killed half-way
    leaves pending grants only, which expire so the next pass retries.
    """
    if not rt.redis.set(REAP_LOCK_KEY, "1", nx=True, px=int(REAP_LOCK_TTL_S * 1000)):
        return []
    recoveries: list[Recovery] = []
    try:
        for job_id in rt.fleet.held_ids():
            if rt.leases.alive(job_id):
                continue
            token = new_token()
            if not rt.leases.grant(job_id, token, rt.pending_grant_ttl_s, only_if_absent=True):
                continue  # someone else recovered it in the meantime
            recovery = recover(rt, job_id, token, no_media=WORKER_LOST)
            if recovery is not None:
                log.warning("job %s: worker lost; redispatching transcription", job_id)
                recoveries.append(recovery)
    finally:
        rt.redis.delete(REAP_LOCK_KEY)
    return recoveries
