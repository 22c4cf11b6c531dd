"""Who joins a batch: the ready short jobs a gpu slot takes along with its own, each by its lease."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis

from workers.lease import LeaseState
from workers.voicy.fleet import HeldJob
from workers.voicy.runtime import VoicyRuntime

log = logging.getLogger(__name__)

GATHER_POLL_S = 0.025  # how often a waiting slot looks for newly ready jobs
CANDIDATES_PER_LOOK = 256  # gpu-set members read per look (the longest waiting first): one MGET each

Join = Callable[[str, str], None]  # (job id, running lease value): start its keeper, add it to the batch


def batchable(held: HeldJob | None, window_s: float) -> bool:
    """A job whose media is stored and fits one window (or whose length is not known: see ``probe``)."""
    if held is None or not held.media_key:
        return False
    return held.duration_s is None or held.duration_s <= window_s


def gather(rt: VoicyRuntime, own_id: str, *, limit: int, window_s: float, join: Join,
           clock: Callable[[], float] = time.monotonic) -> int:
    """Take up to ``limit`` ready short jobs besides ``own_id``, calling ``join`` for each; return how many.

    Each job is taken by the compare-and-set its own task would use (``Leases.take`` with the
    grant's token), so it is still transcribed by exactly one execution (V2). Batching happens
    here, not in Celery (``celery-batches``): that needs a prefetch of the batch size, and
    buffered unacked messages of a killed worker would be stranded until the visibility timeout
    (docs/DESIGN.md "Batching short voices"); here nothing waits but in Redis, where the reaper
    sees it. The wait is bounded by ``VOICY_WORKER_CLIP_BATCH_WAIT_MS`` and lasts only while jobs
    are still downloading (``Fleet.incoming``), so a lone voice is not delayed. Polling, not an
    event: a wake-up list would wake only one of several waiting slots. Best effort: a Redis
    error ends the gathering and the slot transcribes what it holds.
    """
    started = clock()
    deadline = started + rt.settings.clip_batch_wait_s
    seen = {own_id}
    taken = waits = 0
    try:
        while True:
            taken += take_ready(rt, seen, limit - taken, window_s, join)
            if taken >= limit or clock() >= deadline or not rt.fleet.incoming():
                break
            waits += 1
            time.sleep(min(GATHER_POLL_S, max(0.0, deadline - clock())))
    except redis.RedisError as exc:
        log.warning("could not look for jobs to batch with %s (%s); going on with %d", own_id,
                    type(exc).__name__, 1 + taken)
        return taken
    if waits:
        log.info("job %s: waited %.0f ms for jobs on their way; %d joined", own_id,
                 (clock() - started) * 1000, taken)
    return taken


def take_ready(rt: VoicyRuntime, seen: set[str], want: int, window_s: float, join: Join) -> int:
    """One look at the gpu set, no wait: take every queued, batchable job not seen yet, up to ``want``.

    Also how a batch takes more jobs between its passes (``workers.voicy.transcription``)."""
    ids = [job_id for job_id in rt.fleet.gpu_ids(CANDIDATES_PER_LOOK) if job_id not in seen]
    if not ids:
        return 0
    taken = 0
    for job_id, held, lease in zip(ids, rt.fleet.get_many(ids), rt.leases.states(ids)):
        if taken >= want:
            break
        if lease.state is not LeaseState.GRANTED or lease.token is None:
            continue  # running (its task or another slot has it), or nobody's: the reaper's
        if not batchable(held, window_s):
            seen.add(job_id)  # long, or no media: its own task transcribes it alone
            continue
        lease_value = rt.leases.take(job_id, lease.token, rt.lease_ttl_s)
        if lease_value is None:
            continue  # its own task (or another slot) took it first
        seen.add(job_id)
        join(job_id, lease_value)
        rt.fleet.leave_backlog(job_id)
        taken += 1
    return taken
