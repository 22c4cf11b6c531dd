"""The Voicy bridge: claim work from the Worker API and turn it into Celery tasks."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from pathlib import PurePosixPath

import redis
from kombu.exceptions import OperationalError

from workers import liveness
from workers.errors import AuthError, JobError, StaleJobError
from workers.logs import redact
from workers.outage import Outage
from workers.voicy.fleet import Stage
from workers.voicy.models import Bucket, Job
from workers.voicy.pipeline import adopt_claim, recover
from workers.voicy.runtime import VoicyRuntime

log = logging.getLogger(__name__)

MEDIA_NOT_AVAILABLE = "media not available to this fleet after a restart"  # claim-ready, no media: why
POLL_JITTER_FRACTION = 0.2  # ±20% so a fleet of bridges does not poll in lockstep
ERROR_BACKOFF_INITIAL_S = 1.0
ERROR_BACKOFF_MAX_S = 60.0
AUTH_RECHECK_INTERVAL_S = 60.0  # a disabled token is checked slowly, not hammered
BUCKETS: tuple[Bucket, Bucket] = ("oldest", "newest")
# Redis itself, or Celery's broker (kombu wraps the connection error) when a task is sent.
REDIS_ERRORS = (redis.RedisError, OperationalError)

Dispatch = Callable[[VoicyRuntime, str, str], None]  # send the task, then confirm its grant


class BucketCycle:
    """Alternates ``oldest`` and ``newest`` on every call."""

    def __init__(self) -> None:
        self._next = 0

    def take(self) -> Bucket:
        bucket = BUCKETS[self._next]
        self._next ^= 1
        return bucket


class VoicyBridge:
    """One bridge instance. ``run()`` loops until ``stop()``; ``cycle()`` is one pass."""

    def __init__(self, rt: VoicyRuntime, dispatch_download: Dispatch,
                 dispatch_transcription: Dispatch) -> None:
        self.rt = rt
        self._dispatch_download = dispatch_download
        self._dispatch_transcription = dispatch_transcription
        self._download_buckets = BucketCycle()
        self._ready_buckets = BucketCycle()
        self._stop = threading.Event()
        self._outage = Outage.redis_loop("the voicy bridge", log)  # Redis gone: logged once, backoff, resumed (R1)
        self.authorized = True
        self.instance = liveness.process_name()
        self._record_state: str | None = None  # what the liveness record says now, and when it is due again
        self._record_due = 0.0
        s = rt.settings
        assert s.ready_queue_limit is not None  # VoicySettings._derive resolves it
        self.backlog_limit = int(s.ready_queue_limit)
        self.gpu_capacity = s.transcription_concurrency
        self.poll_interval_s = s.poll_interval_ms / 1000.0

    # --- one pass ----------------------------------------------------------------------------
    def cycle(self) -> int:
        """Claim as much as the limits allow; return how many jobs were taken."""
        return self._fill_downloads() + self._fill_recovered()

    def _fill_downloads(self) -> int:
        """``claim-download`` while the fleet-wide backlog is under ``VOICY_WORKER_READY_QUEUE_LIMIT``.

        A backlog slot is reserved in Redis *before* each claim, so any number of bridges together
        never exceed the limit. A claim whose response is lost, or a bridge killed before
        ``adopt_claim``, leaves the job ``downloading`` at Voicy with no record of ours; only its
        reservation expires (``RESERVATION_TTL_S``)."""
        taken = 0
        while not self._stop.is_set():
            slot = self.rt.fleet.reserve_backlog(self.backlog_limit)
            if slot is None:
                break
            if self._stop.is_set():  # SIGTERM while reserving: claim nothing more
                self.rt.fleet.cancel_backlog(slot)
                break
            try:
                job = self.rt.client.claim_download(self._download_buckets.take())
            except BaseException:
                self.rt.fleet.cancel_backlog(slot)
                raise
            if job is None:
                self.rt.fleet.cancel_backlog(slot)
                break
            try:  # the slot swap, hold and grant are one Redis transaction
                token = adopt_claim(self.rt, job.id, attempts=job.attempts,
                                    language=job.recognition_language_hint, slot=slot)
            except Exception:
                self._hand_back_claim(job.id)
                raise
            self._dispatch_download(self.rt, job.id, token)
            log.info("claimed job %s for download (attempt %s)", job.id, job.attempts)
            taken += 1
        return taken

    def _hand_back_claim(self, job_id: str) -> None:
        """The claim could not be recorded (Redis error): nothing of ours will ever end the job,
        and Voicy reaps no ``downloading`` job, so hand it back now with a retryable failure."""
        try:
            self.rt.client.failure(job_id, "worker could not record the claim", retryable=True)
            log.warning("job %s: could not record the claim; handed it back to Voicy", job_id)
        except StaleJobError:
            pass
        except (JobError, AuthError) as exc:
            log.error("job %s: could not record the claim nor hand it back (%s); it stays downloading "
                      "at Voicy until failed there", job_id, redact(str(exc)))

    def _fill_recovered(self) -> int:
        """``claim-ready`` while gpu capacity is free: recovers this worker's ready and stale jobs after a restart."""
        taken = 0
        while not self._stop.is_set() and self.rt.fleet.gpu_load() < self.gpu_capacity:
            first = self._ready_buckets.take()
            job = self.rt.client.claim_ready(first)
            if job is None and not self._stop.is_set():
                job = self.rt.client.claim_ready(BUCKETS[BUCKETS.index(first) ^ 1])
            if job is None:
                break
            taken += 1
            self._recover(job)
        return taken

    def _recover(self, job: Job) -> None:
        """A ready or stale job of ours: adopt it, then ``pipeline.recover`` (media in the store →
        transcribe, else a retryable failure so Voicy downloads it afresh)."""
        if self.rt.fleet.is_held(job.id) and self.rt.leases.alive(job.id):
            log.info("job %s is already being handled by this fleet", job.id)
            return
        key = PurePosixPath((job.local_source_path or "").replace("\\", "/")).name or None
        try:
            token = adopt_claim(self.rt, job.id, attempts=job.attempts, language=job.recognition_language_hint,
                                stage=Stage.DOWNLOADED, media_key=key)
        except Exception:
            self._hand_back_claim(job.id)
            raise
        recovery = recover(self.rt, job.id, token, no_media=MEDIA_NOT_AVAILABLE)
        if recovery is None:
            log.info("handed ready job %s back to Voicy for a fresh download", job.id)
            return
        self._dispatch_transcription(self.rt, recovery.job_id, recovery.token)
        log.info("recovered ready job %s from the media store", job.id)

    # --- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
        backoff_s = ERROR_BACKOFF_INITIAL_S
        log.info("voicy bridge started (backlog limit %d, gpu capacity %d, poll %.2fs)",
                 self.backlog_limit, self.gpu_capacity, self.poll_interval_s)
        while not self._stop.is_set():
            try:
                taken = self.cycle()
            except AuthError:
                if self.authorized:
                    log.error("Voicy rejected VOICY_WORKER_TOKEN (invalid or disabled): claiming "
                              "stopped; checking again every %.0fs", AUTH_RECHECK_INTERVAL_S)
                self.authorized = False
                self._renew_record("Voicy rejects VOICY_WORKER_TOKEN; claiming stopped", AUTH_RECHECK_INTERVAL_S)
                self._stop.wait(AUTH_RECHECK_INTERVAL_S)
                continue
            except REDIS_ERRORS as exc:
                self._stop.wait(self._outage.failed("claim cycle", exc))
                continue
            except JobError as exc:
                log.warning("Voicy API unavailable (%s); retrying in %.1fs",
                            redact(str(exc)), backoff_s)
                self._renew_record(f"Voicy API unavailable ({redact(str(exc))})", backoff_s)
                self._stop.wait(backoff_s)
                backoff_s = min(backoff_s * 2, ERROR_BACKOFF_MAX_S)
                continue
            if not self.authorized:
                log.info("Voicy accepts the worker token again; claiming resumed")
                self.authorized = True
            self._outage.ok()
            backoff_s = ERROR_BACKOFF_INITIAL_S
            self._renew_record(liveness.OK, self.poll_interval_s * (1 + POLL_JITTER_FRACTION))
            if taken == 0:
                self._idle()
        self._forget_record()
        log.info("voicy bridge stopped")

    # --- the liveness record (``switchyard health``: "the Voicy bridge is polling") -------------
    def _renew_record(self, state: str, wait_s: float) -> None:
        """Say what this bridge does, for as long as its next wait plus the record's TTL.

        Written when the state changes, else at most every ``RENEW_INTERVAL_S``.
        A Redis error is left to the loop's own outage report: the record then
        expires, which is what the verdict should see."""
        now = time.monotonic()
        if state == self._record_state and now < self._record_due:
            return
        record = liveness.ProcessRecord(role=liveness.VOICY_BRIDGE, name=self.instance, state=state)
        try:
            liveness.renew(self.rt.redis, record, wait_s + liveness.RECORD_TTL_S)
        except REDIS_ERRORS:
            self._record_state = None
            return
        self._record_state, self._record_due = state, now + liveness.RENEW_INTERVAL_S

    def _forget_record(self) -> None:
        """A stopped bridge polls nothing: its record goes at once, not when its TTL runs out."""
        try:
            liveness.forget(self.rt.redis, liveness.VOICY_BRIDGE, self.instance)
        except REDIS_ERRORS:
            pass  # Redis away at stop: the record expires by itself

    def _idle(self) -> None:
        """Wait for the poll interval, or less if the fleet frees capacity.

        The wait is a BLPOP on Redis: a Redis restart during it is an outage like
        one during a cycle (logged once, retried with backoff), not a crash.
        """
        jitter = 1 + random.uniform(-POLL_JITTER_FRACTION, POLL_JITTER_FRACTION)
        try:
            self.rt.fleet.wait_for_capacity(self.poll_interval_s * jitter)
        except REDIS_ERRORS as exc:
            self._stop.wait(self._outage.failed("capacity wait", exc))

    def stop(self) -> None:
        """Stop claiming (called from the SIGTERM handler); ``run()`` returns within a poll interval.

        A claim already answered is still adopted and dispatched before the loop
        exits, so nothing claimed is dropped; the job's lease, the workers and the
        beat reaper finish it without this process (it holds no job in memory).
        """
        self._stop.set()
