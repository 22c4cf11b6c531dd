"""The grant audit: confirmed grants whose task's message no worker will run, found by the reaper.

A Voicy task is sent, then its grant confirmed for ``QUEUED_LEASE_TTL_S`` (6 h),
because a queued task is safe in the broker (``workers.voicy.pipeline``). It is
not always: a worker's main process that took the message from its queue and
then lost its broker connection, or was SIGKILLed, before its pool started the
task leaves the message in kombu's ``unacked`` hash until the 12 h visibility
timeout restores it; Sentinel's asynchronous replication can lose it outright
(the pop replicated, kombu's write into ``unacked`` not); a task that was acked
and died before taking its grant leaves no message at all. Each time the job
stays granted, heartbeated and never reaped, for hours, to a task nobody runs.

So the reaper audits every *confirmed* grant (a remaining TTL longer than a
pending grant's) against the broker's messages, read by the tasks layer
(:data:`BrokerScan`, ``tasks.hardening.transport``: Celery and kombu stay out of here). A
grant whose message waits in a queue is fine, however long it waits. A grant
whose message has been out of every queue for ``VOICY_WORKER_STRANDED_GRANT_MS``
is stranded: under early ack with prefetch disabled a delivered message is
started (acked) within milliseconds and its task takes the grant at once. The
time out of the queues is counted from the first pass that saw it (a mark in
Redis whose age is its TTL's remainder, no clocks compared), so a message seen
between kombu's pop and its ``unacked`` write, or a take retrying across a Redis
blip, is never taken for lost by one unlucky pass.

Where the message is (delivered but not acked, or nowhere) only shapes the log
line: either way the job is recovered by the reaper (``pipeline.reap``), which
replaces the grant by compare-and-set. Being wrong costs a redo, never a double:
a late original task finds its grant gone and does nothing (V2). kombu's own
``unacked`` entry is left alone; its restore, hours later, delivers that no-op.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workers.lease import LeaseState
from workers.voicy.runtime import VoicyRuntime

OUT_OF_QUEUE_PREFIX = "sy:voicy:unqueued:"  # + job id: the token whose message a pass found out of the queues
OUT_OF_QUEUE_MARK_MIN_TTL_S = 3600.0  # a mark outlives any gap between passes; then the count restarts
OUT_OF_QUEUE_MARK_GRACES = 4.0  # ... and at least this many graces, whatever the grace
STRANDED_TASK = "task lost by the broker before any worker ran it"  # the failure Voicy gets when no media


@dataclass(frozen=True)
class BrokerMessages:
    """The lease tokens carried by Voicy task messages in the broker, by where they are."""

    queued: frozenset[str]  # waiting in a queue: a worker will take them
    delivered: frozenset[str]  # taken by a worker and not acked (kombu's ``unacked``)


BrokerScan = Callable[[], BrokerMessages]  # reads the broker now (``tasks.voicy.broker_messages``)


@dataclass(frozen=True)
class Stranded:
    """A confirmed grant whose task's message has been out of every queue for the grace or longer."""

    job_id: str
    token: str
    out_for_s: float
    delivered: bool  # the message is in kombu's ``unacked`` (delivered to a worker that never ran it)

    def describe(self) -> str:
        where = "delivered to a worker that never started it" if self.delivered else "in no queue nor delivery"
        return f"its task's message out of every queue for {self.out_for_s:.0f}s, {where}"


def confirmed_grants(rt: VoicyRuntime, job_ids: list[str]) -> list[tuple[str, str]]:
    """(job id, token) of each job granted to a task that was sent and confirmed.

    A pending grant (its task maybe not sent yet) is left out: it expires within
    a lease TTL, and the reaper's usual pass recovers it.
    """
    pending_ms = rt.pending_grant_ttl_s * 1000
    return [(job_id, lease.token) for job_id, (lease, ttl_ms) in zip(job_ids, rt.leases.states_with_ttl(job_ids))
            if lease.state is LeaseState.GRANTED and lease.token and ttl_ms > pending_ms]


def stranded(rt: VoicyRuntime, scan: BrokerScan) -> list[Stranded]:
    """The held jobs whose confirmed grant is stranded now; the broker is read only if one is confirmed."""
    grants = confirmed_grants(rt, rt.fleet.held_ids())
    if not grants:
        return []
    messages = scan()
    grace_s = rt.settings.stranded_grant_s
    found: list[Stranded] = []
    waiting = [job_id for job_id, token in grants if token in messages.queued]
    if waiting:
        rt.redis.delete(*(mark_key(job_id) for job_id in waiting))  # back in (or still in) a queue
    for job_id, token in grants:
        if token in messages.queued:
            continue
        out_for_s = _out_of_queue_for(rt, job_id, token, grace_s)
        if out_for_s >= grace_s:
            found.append(Stranded(job_id, token, out_for_s, token in messages.delivered))
    return found


def mark_key(job_id: str) -> str:
    return f"{OUT_OF_QUEUE_PREFIX}{job_id}"


def _out_of_queue_for(rt: VoicyRuntime, job_id: str, token: str, grace_s: float) -> float:
    """How long passes have found ``token``'s message out of the queues: 0 at the first, then the mark's age."""
    ttl_s = max(OUT_OF_QUEUE_MARK_MIN_TTL_S, OUT_OF_QUEUE_MARK_GRACES * grace_s)
    key = mark_key(job_id)
    if rt.redis.set(key, token, px=int(ttl_s * 1000), nx=True):
        return 0.0
    with rt.redis.pipeline(transaction=True) as pipe:
        value, left_ms = pipe.get(key).pttl(key).execute()
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if value != token:  # expired just now, or an earlier grant's mark
        rt.redis.set(key, token, px=int(ttl_s * 1000))
        return 0.0
    return max(0.0, ttl_s - left_ms / 1000)
