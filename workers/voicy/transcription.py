"""The transcription step: a job's stored media to its result, alone or in a batch of short jobs."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import redis

from workers.errors import AuthError, PermanentJobError, RetryableJobError, StaleJobError
from workers.lease import LeaseKeeper
from workers.logs import redact
from workers.transcribe.engine import get_engine
from workers.transcribe.protocol import CLIP_WINDOW_S, Clip, ClipBatchingEngine, OnSegment, TranscriptionEngine
from workers.transcribe.results import Transcript
from workers.voicy.bodies import transcript_body
from workers.voicy.fleet import HeldJob, Stage
from workers.voicy.gather import batchable, gather, take_ready
from workers.voicy.outcomes import LeaseLost, finish, guarded, hand_back, settle
from workers.voicy.progress import ProgressThrottle
from workers.voicy.runtime import VoicyRuntime

log = logging.getLogger(__name__)

# Passes one gpu task runs at most. While each pass decodes it takes the short jobs that became
# ready since (on the clip batcher's look thread), so their claims, media and speech are ready when
# the pass ends, not fetched in front of the next one; the bound hands the slot back to Celery now and then.
PASSES_PER_TASK = 4
# Jobs a batch starts at once (each a ``POST /transcribe`` and a media fetch, two round trips): a
# batch of 16 then waits about one job's latency, not sixteen, before its pass can have them.
START_THREADS = 8


def run_transcription(rt: VoicyRuntime, job_id: str, token: str) -> bool:
    """Transcribe the job (alone or with a batch of short ones) and post its result. True if posted."""
    lease_value = rt.leases.take(job_id, token, rt.lease_ttl_s)
    if lease_value is None:
        log.info("job %s: transcription already owned by another execution; skipping", job_id)
        return False
    rt.fleet.leave_backlog(job_id)
    if _may_batch(rt, job_id):
        return _Batch(rt).run(job_id, lease_value)
    return bool(guarded(rt, job_id, lease_value, lambda keeper: _Job(rt, job_id, lease_value, keeper).alone()))


def _may_batch(rt: VoicyRuntime, job_id: str) -> bool:
    if not rt.settings.clip_batching:
        return False
    try:
        return batchable(rt.fleet.get(job_id), CLIP_WINDOW_S)
    except redis.RedisError:
        return False  # the job goes alone; its own steps meet the outage under its guard


@dataclass
class _Job:
    """One job under its running lease: the steps from ``/transcribe`` to its result."""

    rt: VoicyRuntime
    job_id: str
    lease_value: str
    keeper: LeaseKeeper
    held: HeldJob | None = None
    throttle: ProgressThrottle | None = None
    started: float = field(default_factory=time.monotonic)
    open: bool = True  # not ended yet (no result, failure or drop)
    posted: bool = False
    batch: int = 1  # jobs taken into the batch together with this one (the log's "in a batch of")

    def start(self) -> HeldJob:
        """Check the media, ``POST /transcribe`` and mark the record: the job is being transcribed.

        The progress throttle starts here, as the step does (its first post waits one interval).
        """
        self.started = time.monotonic()
        self.throttle = ProgressThrottle.from_settings(self.rt.settings)
        held = self.rt.fleet.get(self.job_id)
        if held is None or not held.media_key or not self.rt.store.exists(held.media_key):
            raise RetryableJobError("downloaded media is missing from the media store")
        _enter_transcribing(self.rt, self.job_id, held.media_key)
        held.stage = Stage.TRANSCRIBING
        self.rt.fleet.update(held)
        self.held = held
        return held

    def on_progress(self, engine: TranscriptionEngine) -> OnSegment:
        """The engine's ``on_segment`` for this job: stop if the lease was lost, else maybe post progress."""
        def on_segment(partial: Transcript) -> None:
            if self.keeper.lost.is_set():
                raise LeaseLost(self.job_id)
            if self.throttle is not None and self.throttle.should_send(partial.text):
                try:
                    self.rt.client.progress(self.job_id,
                                            transcript_body(partial, self.rt.settings.engine, engine.metadata))
                except (RetryableJobError, PermanentJobError) as exc:
                    log.warning("job %s: progress not stored: %s", self.job_id, redact(str(exc)))
        return on_segment

    def post(self, transcript: Transcript, engine: TranscriptionEngine, batch: int = 1) -> bool:
        """Post the result and forget the job (raises like any step; the caller settles)."""
        if not self.keeper.fence():  # the result is final at Voicy: only the lease's owner may post it
            raise LeaseLost(self.job_id)
        self.rt.client.result(self.job_id, transcript_body(transcript, self.rt.settings.engine, engine.metadata))
        self.open, self.posted = False, True
        log.info("job %s transcribed in %.2fs%s (%.1fs of audio, %d parts)", self.job_id,
                 time.monotonic() - self.started, f" in a batch of {batch}" if batch > 1 else "",
                 transcript.duration or 0.0, len(transcript.parts))
        try:
            finish(self.rt, self.job_id, self.lease_value)
        except redis.RedisError as exc:  # the job is done at Voicy: nothing to fail, only records to clear
            log.warning("job %s: result posted; its records wait for Redis (%s), the reaper clears them",
                        self.job_id, redact(f"{type(exc).__name__}: {exc}"))
        return True

    def transcribe_started(self, engine: TranscriptionEngine) -> bool:
        """Transcribe the started job on its own, streaming progress, and post the result."""
        assert self.held is not None and self.held.media_key
        with self.rt.store.local_path(self.held.media_key) as path:
            transcript = engine.transcribe(path, language=self.held.language, on_segment=self.on_progress(engine))
        return self.post(transcript, engine)

    def alone(self) -> bool:
        """The whole step for a job transcribed on its own (errors are mapped by the caller)."""
        self.start()
        return self.transcribe_started(get_engine(self.rt.settings))


class _Batch:
    """Short jobs one gpu slot transcribes in batched passes, each under its own lease keeper.

    Only the decode is shared (``transcribe_clips``): each job keeps its own lease, heartbeats,
    ``/transcribe``, progress, result or failure, and one that fails ends alone; a job's result is
    posted when its own pass ends. While each pass decodes the slot takes the short jobs that became
    ready since (``_more``, on the batcher's look thread; up to ``PASSES_PER_TASK`` passes' worth). A job the
    passes do not answer (longer than a window, or a decode the sequential engine would retry
    hotter) is transcribed alone afterwards. A shutdown mid-batch hands back every job not yet
    ended (V1).
    """

    def __init__(self, rt: VoicyRuntime) -> None:
        self.rt = rt
        self.jobs: list[_Job] = []
        self._keepers = contextlib.ExitStack()
        self._auth: AuthError | None = None
        self._room = 0  # jobs this task may still take between passes (PASSES_PER_TASK)

    def join(self, job_id: str, lease_value: str) -> None:
        """Add a job whose lease was just taken, and start renewing that lease at once."""
        keeper = self._keepers.enter_context(LeaseKeeper(self.rt.leases, job_id, lease_value, self.rt.lease_ttl_s))
        self.jobs.append(_Job(self.rt, job_id, lease_value, keeper))

    def run(self, job_id: str, lease_value: str) -> bool:
        """Gather, transcribe and end every job; True if ``job_id``'s own result was posted."""
        with self._keepers:
            self.join(job_id, lease_value)
            try:
                self._run()
            except SystemExit:  # shut down under us: every job not ended goes back to the reaper now
                for job in self.jobs:
                    if job.open:
                        hand_back(self.rt, job.job_id, job.lease_value)
                raise
        if self._auth is not None:
            raise self._auth  # as alone: the task fails, the leases expire, the reaper retries later
        return self.jobs[0].posted

    def _settle(self, job: _Job, exc: Exception) -> None:
        """End one job after ``exc`` (``outcomes.settle``); the others are not affected."""
        job.open = False
        try:
            settle(self.rt, job.job_id, job.lease_value, exc, job.keeper)
        except AuthError as auth:
            self._auth = auth
        except Exception as report_exc:  # e.g. Voicy down while reporting: the lease expires, the reaper ends it
            log.warning("job %s: could not report its outcome (%s); the reaper will recover it",
                        job.job_id, redact(str(report_exc)) or type(report_exc).__name__)
        job.keeper.stop()

    def _end(self, job: _Job, step: Callable[[], object]) -> None:
        """Run one job's closing step; any error ends that job alone."""
        try:
            step()
        except Exception as exc:
            self._settle(job, exc)
            return
        job.keeper.stop()

    def _run(self) -> None:
        own = self.jobs[0]
        try:
            engine = get_engine(self.rt.settings)
        except Exception as exc:
            self._settle(own, exc)
            return
        if isinstance(engine, ClipBatchingEngine) and engine.max_clips > 1:
            gather(self.rt, own.job_id, limit=engine.max_clips - 1, window_s=CLIP_WINDOW_S, join=self.join)
        if len(self.jobs) == 1 or not isinstance(engine, ClipBatchingEngine):
            self._end(own, own.alone)
            return
        left = self._batch(engine)
        for job in left:  # after every job the batch answered has its result
            self._end(job, partial(job.transcribe_started, engine))

    def _batch(self, engine: ClipBatchingEngine) -> list[_Job]:
        """Start every job, decode them in batched passes (taking the jobs that became ready before each
        pass along), post each outcome as its pass ends; return the ones the passes left alone."""
        started: list[_Job] = []
        self._room = engine.max_clips * PASSES_PER_TASK - len(self.jobs)
        with contextlib.ExitStack() as files:
            clips = self._start(self.jobs, engine, files, started)
            try:
                outcomes = engine.transcribe_clips(clips, lambda: self._more(engine, files, started)) if clips else []
            except Exception as exc:  # the engine promises one outcome per clip; anything else ends them all
                for job in started:
                    if job.open:
                        self._settle(job, exc)
                return []
        left: list[_Job] = []
        for job, outcome in zip(started, outcomes):
            if not job.open:
                continue  # ended when its pass did (Clip.on_done)
            if outcome is None:
                left.append(job)
            else:
                self._conclude(job, outcome, engine)
        return left

    def _more(self, engine: ClipBatchingEngine, files: contextlib.ExitStack, started: list[_Job]) -> list[Clip]:
        """The short jobs that became ready since the last look, up to one pass and the task's bound.

        Runs on the batcher's look thread beside a pass: it alone adds jobs, and the pass's results
        (main thread) touch only their own jobs; Redis, httpx and boto3 clients are thread-safe."""
        if self._room <= 0:
            return []
        before, began = len(self.jobs), time.monotonic()
        try:
            take_ready(self.rt, {job.job_id for job in self.jobs}, min(engine.max_clips, self._room),
                       CLIP_WINDOW_S, self.join)
        except redis.RedisError as exc:
            log.warning("could not look for more jobs to batch (%s); going on with these", type(exc).__name__)
            self._room = 0
        self._room -= len(self.jobs) - before
        clips = self._start(self.jobs[before:], engine, files, started)
        if clips:
            log.info("took %d ready jobs beside the pass in %.3fs", len(clips), time.monotonic() - began)
        return clips

    def _start(self, jobs: list[_Job], engine: ClipBatchingEngine, files: contextlib.ExitStack,
               started: list[_Job]) -> list[Clip]:
        """``/transcribe`` each job and fetch its media, all at once: its clip, or the job ends here alone."""
        clips: list[Clip] = []
        for job, opened in zip(jobs, self._open_all(jobs)):
            if isinstance(opened, Exception):
                self._settle(job, opened)
                continue
            media, path, held = opened
            files.enter_context(media)  # the media's local copy lives as long as the batch
            started.append(job)
            clips.append(Clip(path, held.language, job.on_progress(engine),
                              partial(self._conclude, job, engine=engine)))
        for job in started[len(started) - len(clips):]:
            job.batch = len(clips)
        return clips

    def _open_all(self, jobs: list[_Job]) -> list[tuple[contextlib.ExitStack, Path, HeldJob] | Exception]:
        """Each job started and its media local, on up to ``START_THREADS`` threads (httpx, redis-py and
        boto3 clients are thread-safe); a job's error is its outcome."""
        if len(jobs) <= 1:
            return [self._open(job) for job in jobs]
        with ThreadPoolExecutor(min(START_THREADS, len(jobs)), thread_name_prefix="job-start") as pool:
            futures = [pool.submit(self._open, job) for job in jobs]
            try:
                return [future.result() for future in futures]
            except BaseException:  # shut down under us (SystemExit): close what the threads still open
                pool.shutdown(wait=True, cancel_futures=True)
                for future in futures:
                    opened = None if future.cancelled() else future.result()
                    if isinstance(opened, tuple):
                        opened[0].close()  # an S3 media's local copy, removed now, not left behind
                raise

    def _open(self, job: _Job) -> tuple[contextlib.ExitStack, Path, HeldJob] | Exception:
        try:
            held = job.start()
            with contextlib.ExitStack() as media:
                path: Path = media.enter_context(self.rt.store.local_path(held.media_key or ""))
                return media.pop_all(), path, held
        except Exception as exc:
            return exc

    def _conclude(self, job: _Job, outcome: Transcript | Exception, engine: ClipBatchingEngine) -> None:
        """Post a job's result, or end it with the exception that ended its clip."""
        if isinstance(outcome, Exception):
            self._settle(job, outcome)
        else:
            self._end(job, lambda: job.post(outcome, engine, job.batch))


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
