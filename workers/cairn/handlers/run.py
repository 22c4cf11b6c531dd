"""``run_job``: one admitted Cairn job under its lease, its outcome recorded before it returns.

Why here and not in the task module: the lease (take, keep, release) and the
outcome ledger are domain rules, the same whatever runs them, so the Celery
task stays a few lines (as the Voicy tasks, whose leases live in
``workers/voicy/pipeline.py``).

The order is the point (C4):

1. *take* the lease the bridge granted to this task's token (compare-and-set);
   a copy whose grant was revoked or replaced does nothing and records nothing;
2. run the handler while a keeper thread renews the lease;
3. *record* the disposition in the outcome ledger, still holding the lease, so
   a bridge that sees the message again (its own, or another instance after
   the first died) applies it instead of running the job again;
4. release the lease and return the disposition to the bridge that waits.

A copy whose lease was lost while it ran (another copy owns the message now)
records nothing: the owner's outcome is the one that counts.
"""

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
        leases.release(key.id, running)
    return disposition
