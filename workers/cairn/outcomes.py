"""The outcome ledger: what a finished job decided, kept until its message is settled (C4)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import ValidationError
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from workers.cairn.disposition import Disposition

log = logging.getLogger(__name__)

LEASE_NAMESPACE = "cairn"  # workers.lease namespace of Cairn job leases (key = MessageKey.id)
OUTCOME_PREFIX = "sy:cairn:outcome:"
FAILURES_PREFIX = "sy:cairn:failures:"  # the bridge's failed-delivery counts, same MessageKey.id
OUTCOME_TTL_S = 24 * 3600  # a day: outlives a pool-wide bridge outage; the bridge deletes it sooner
# A job task records its outcome through a Redis outage (R1): its result is already published,
# and an outcome lost here makes the redelivery run the job again (C4). Longer than the 60 s
# outage the fleet must ride out; the bridge waits for the record that long (bridges.cairn.execution).
RECORD_RETRY_FOR_S = 90.0
RECORD_RETRY_MAX_WAIT_S = 2.0  # backoff cap: the record lands within this of Redis coming back
RECORD_RETRY_FIRST_WAIT_S = 0.1


@dataclass(frozen=True)
class MessageKey:
    """One JetStream message across all its redeliveries: its stream, sequence and stream timestamp.

    The same name in every Redis key the fleet keeps for it (ledger, lease, failure count). The
    stream keeps ``CAIRN_WEBHOOKS`` apart from ``CAIRN_JOBS``; the timestamp differs when core
    recreates a stream. No pool is needed (C6): a message sits on exactly one pool's subject.
    """

    stream: str
    seq: int
    stamp: float  # the stream timestamp, seconds since the epoch

    @property
    def id(self) -> str:
        return f"{self.stream}:{self.seq}:{self.stamp:.6f}"

    def as_meta(self) -> dict[str, Any]:
        """The fields a task's ``meta`` carries so the task names the message as the bridge does."""
        return {"stream": self.stream, "seq": self.seq, "stamp": self.stamp}

    @classmethod
    def from_meta(cls, meta: dict[str, Any], default_stream: str = "") -> MessageKey:
        return cls(str(meta.get("stream") or default_stream), int(meta["seq"]), float(meta.get("stamp") or 0.0))


def ledger_key(key: MessageKey) -> str:
    return f"{OUTCOME_PREFIX}{key.id}"


def failures_key(key: MessageKey) -> str:
    return f"{FAILURES_PREFIX}{key.id}"


def encode(disposition: Disposition) -> bytes:
    return disposition.model_dump_json().encode()


def decode(raw: bytes | str | None) -> Disposition | None:
    """A recorded outcome, or None (absent, or unreadable: then the job simply runs again)."""
    if not raw:
        return None
    try:
        return Disposition.model_validate_json(raw)
    except ValidationError:
        log.warning("unreadable outcome ledger entry ignored")
        return None


REPLICA_WAIT_MS = 1000  # bound on WAIT for the replicas to hold a recorded outcome (Sentinel only)


class OutcomeLedger:
    """The ledger through a blocking client (job tasks, ``workers.redisconn.sync_client``).

    The task records its disposition before it returns (and releases its lease), so a bridge
    that dies before acking does not make the redelivery run the job twice: any bridge reads the
    ledger first and applies a recorded outcome. The bridge records its own terms here too. It
    deletes the entry when it settles the message; a lost delete expires after ``OUTCOME_TTL_S``.

    ``replicas``: with Redis Sentinel, wait (``WAIT``, at most ``REPLICA_WAIT_MS``) until that
    many replicas hold the entry before the task returns. Replication is asynchronous: a master
    killed right after acknowledging the write would otherwise take the entry with it, the
    promoted replica would not know the job ran, and the redelivery would run it again.
    """

    def __init__(self, client: Any, *, replicas: int = 0) -> None:
        self._r = client
        self._replicas = replicas

    def record(self, key: MessageKey, disposition: Disposition, *,
               retry_for_s: float = RECORD_RETRY_FOR_S) -> None:
        """Record ``disposition``; while Redis is unreachable, retry with backoff for ``retry_for_s``.

        Logged once when the first attempt fails and once when it lands, not per attempt.
        """
        attempts = Retrying(retry=retry_if_exception_type((redis.ConnectionError, redis.TimeoutError)),
                            wait=wait_exponential(multiplier=RECORD_RETRY_FIRST_WAIT_S,
                                                  max=RECORD_RETRY_MAX_WAIT_S),
                            stop=stop_after_delay(retry_for_s), reraise=True)
        for attempt in attempts:
            with attempt:
                if attempt.retry_state.attempt_number == 2:
                    log.warning("Redis unavailable: recording the outcome of %s; retrying for up to %.0fs",
                                key.id, retry_for_s)
                self._r.set(ledger_key(key), encode(disposition), ex=OUTCOME_TTL_S)
                if self._replicas and self._r.wait(self._replicas, REPLICA_WAIT_MS) < self._replicas:
                    log.warning("outcome of %s not yet on a replica after %d ms", key.id, REPLICA_WAIT_MS)
                if attempt.retry_state.attempt_number > 1:
                    log.warning("outcome of %s recorded after Redis came back", key.id)

    def get(self, key: MessageKey) -> Disposition | None:
        return decode(self._r.get(ledger_key(key)))

    def clear(self, key: MessageKey) -> None:
        self._r.delete(ledger_key(key))


class AsyncOutcomeLedger:
    """The same ledger through an asyncio client (the bridge, ``workers.redisconn.async_client``)."""

    def __init__(self, client: Any) -> None:
        self._r = client

    async def record(self, key: MessageKey, disposition: Disposition) -> None:
        await self._r.set(ledger_key(key), encode(disposition), ex=OUTCOME_TTL_S)

    async def get(self, key: MessageKey) -> Disposition | None:
        return decode(await self._r.get(ledger_key(key)))

    async def clear(self, key: MessageKey) -> None:
        await self._r.delete(ledger_key(key))
