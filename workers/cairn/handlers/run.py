"""``run_job``: one admitted Cairn job under its lease, its outcome recorded before it returns."""

from __future__ import annotations

import logging
from typing import Any

import redis

from workers.cairn.contract.jobs import JOB_MODELS, parse_job
from workers.cairn.contract.subjects import JOBS_STREAM
from workers.cairn.disposition import HANDOVER_NAK_DELAY_S, Disposition, nak
from workers.cairn.handlers import run_admitted
from workers.cairn.handlers.context import Delivery, JobContext
from workers.cairn.outcomes import MessageKey, OutcomeLedger
from workers.lease import LeaseKeeper, Leases

log = logging.getLogger(__name__)


def wrong_pool(ctx: JobContext, meta: dict[str, Any]) -> Disposition | None:
    """A NAK (no failure) for a job another pool's bridge sent, else None (C6).

    Each pool's tasks travel on its own queue, so this only happens when two pools'
    workers consume one queue (a misconfiguration the worker's start check refuses).
    The job is handed back untouched: no lease taken, nothing recorded, so the
    owner pool's task (or the next delivery) runs it with the right provider.
    """
    pool = meta.get("pool")
    if pool is None or pool == ctx.worker_name:
        return None  # ``None``: a bridge from before pools named themselves
    log.error("cairn job of pool %s reached a worker of pool %s: not run; check -Q (provider.<pool>)",
              pool, ctx.worker_name)
    return nak(HANDOVER_NAK_DELAY_S, reason=f"job of pool {pool} reached pool {ctx.worker_name}", failure=False)


def run_job(ctx: JobContext, leases: Leases, ledger: OutcomeLedger, lease_ttl_s: float, kind: str,
            job: dict[str, Any], meta: dict[str, Any]) -> Disposition:
    """Run the admitted ``job`` (the bridge's ``model_dump``) of the message named in ``meta``.

    ``meta``: ``stream``, ``seq``, ``stamp`` (the message), ``delivery`` (its attempt),
    ``subject`` and ``lease_token`` (the bridge's grant to this task).

    The order is the point (C4): take the lease granted to this token (a revoked copy does
    nothing), run the handler under a keeper, record the disposition in the ledger while still
    holding the lease, then release it. A copy that lost its lease records nothing. Domain
    rules, not Celery's, so the task stays a few lines.
    """
    key = MessageKey.from_meta(meta, default_stream=JOBS_STREAM)
    try:
        # No waiting out the outage (Voicy's tasks do): this job's message is still the bridge's,
        # unacked in NATS, so handing it back at once loses nothing and frees the process.
        running = leases.take(key.id, str(meta["lease_token"]), lease_ttl_s, outage_wait_s=0.0)
    except redis.RedisError as exc:
        # Nothing has run and nothing is recorded: the job is handed back, as an ungranted copy is.
        # Redis is away, not the job (R1); the outage itself is reported once by the result backend
        # and the bridge, so this is no warning and no traceback.
        log.info("cairn job %s: lease not taken, Redis unavailable (%s); handed back", key.id, type(exc).__name__)
        return nak(HANDOVER_NAK_DELAY_S, reason="Redis unavailable: lease not taken", failure=False)
    if running is None:
        # The bridge revoked this copy (start deadline, shutdown) or a newer delivery owns the job.
        log.info("cairn job %s: lease not granted to this task; skipping", key.id)
        return nak(HANDOVER_NAK_DELAY_S, reason="lease not granted to this task", failure=False)
    try:
        with LeaseKeeper(leases, key.id, running, lease_ttl_s, reclaim_after_outage=True) as keeper:
            def lost() -> bool:  # Redis unreachable is "unknown", not lost; see LeaseKeeper
                return not keeper.held()

            delivery = Delivery(attempt=int(meta["delivery"]), stream_seq=key.seq,
                                subject=str(meta.get("subject", "")), lost=lost)
            # The round trip of the job admission already parsed and judged (a dump of its
            # model): rebuilt, not re-judged; it cannot fail unless the images disagree.
            # A kind without a job model (a plug-in consumer kind) gets the dump as it is.
            admitted = parse_job(kind, job) if kind in JOB_MODELS else job
            disposition = run_admitted(ctx, kind, admitted, delivery)
            if lost():
                log.info("cairn job %s: lease lost while running; outcome not recorded", key.id)
            else:
                ledger.record(key, disposition)
    finally:
        _release(leases, key.id, running)
    return disposition


def _release(leases: Leases, job_id: str, running: str) -> None:
    """End the lease; Redis failing here fails nothing, since the lease expires by itself (its TTL).

    The outcome is already recorded, and the result may already be at core: a release that raised
    turned a finished job into a failed task, which the bridge NAKs, and the next delivery ran the
    job again, a second result (a Sentinel failover under load, the release on a connection the
    old master had closed). Raised from a failing handler, it would also hide that handler's error.
    """
    try:
        leases.release(job_id, running)
    except redis.RedisError as exc:
        log.info("cairn job %s: lease not released, Redis unavailable (%s); it expires by itself",
                 job_id, type(exc).__name__)
