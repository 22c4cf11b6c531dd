"""The grant audit: confirmed grants whose task's message no worker will run, found by the reaper."""

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
    """The held jobs whose confirmed grant is stranded now; the broker is read only if one is confirmed.

    A confirmed grant can outlive its message: a worker that lost its broker or was killed
    before running the task leaves it in kombu's ``unacked`` until the visibility timeout,
    Sentinel's asynchronous replication can lose it, and an acked task may die before its take.
    Under early ack a delivered message is started within milliseconds, so a message out of
    every queue for ``VOICY_WORKER_STRANDED_GRANT_MS`` is stranded. The time is counted from the
    first pass that saw it (a Redis mark, no clocks compared), so one unlucky pass never decides.
    Being wrong costs a redo, never a double: the reaper replaces the grant by compare-and-set
    and a late original task finds it gone (V2).
    """
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
        pipe.get(key)
        pipe.pttl(key)
        value, left_ms = pipe.execute()
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if value != token:  # expired just now, or an earlier grant's mark
        rt.redis.set(key, token, px=int(ttl_s * 1000))
        return 0.0
    return max(0.0, ttl_s - left_ms / 1000)
