"""The fleet's shared view of the Voicy jobs it holds, kept in Redis."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from enum import Enum
from typing import Any

import redis
from pydantic import BaseModel

PREFIX = "sy:voicy:"
HELD_KEY = PREFIX + "held"
BACKLOG_KEY = PREFIX + "backlog"
GPU_KEY = PREFIX + "gpu"
RECORD_PREFIX = PREFIX + "job:"
WAKE_KEY = PREFIX + "wake"  # a one-item list: pushed when capacity frees, popped by an idle bridge
RESERVATION_TTL_S = 60.0  # a bridge that dies between reserve and claim frees its slot after this

# Reserve a slot: drop expired reservations, then add one if under the limit.
_RESERVE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1])
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4]) return 1 end
return 0
"""
# Adopt a claimed job in one step: swap its backlog reservation (if any) for the job id (kept
# until the job leaves the backlog), hold it, put it on the gpu set (if it needs a slot now),
# and grant its lease. KEYS: record, held, backlog, gpu, lease.
# ARGV: job id, record json, claimed_at, slot or '', gpu score or '', lease value, lease TTL in ms.
_ADOPT = """
if ARGV[4] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[4])
  redis.call('ZADD', KEYS[3], '+inf', ARGV[1])
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
if ARGV[5] ~= '' then redis.call('ZADD', KEYS[4], ARGV[5], ARGV[1]) end
redis.call('SET', KEYS[5], ARGV[6], 'PX', ARGV[7])
return 1
"""
# Jobs on their way to the gpu: backlog members that are jobs (not reservations: a claim in
# flight mostly finds nothing) and not on the gpu set yet, i.e. downloads in flight. KEYS: backlog, gpu.
_INCOMING = """
local n = 0
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '+inf', '+inf')) do
  if not redis.call('ZSCORE', KEYS[2], member) then n = n + 1 end
end
return n
"""


class Stage(str, Enum):
    CLAIMED = "claimed"
    DOWNLOADED = "downloaded"
    TRANSCRIBING = "transcribing"


class HeldJob(BaseModel):
    """What the fleet remembers about a job it holds (no secrets, no URLs)."""

    job_id: str
    stage: Stage = Stage.CLAIMED
    media_key: str | None = None
    language: str | None = None
    attempts: int = 0
    claimed_at: float = 0.0
    duration_s: float | None = None  # the media's length, read at download; None: not known


class Fleet:
    """Shared fleet state; every method is one or two Redis round trips.

    ``held``: every job the fleet holds, with its record (walked by heartbeat and reaper).
    ``backlog``: downloads in flight plus downloaded jobs not yet transcribing; a bridge reserves
    a slot atomically before it claims, so bridges together never exceed
    ``VOICY_WORKER_READY_QUEUE_LIMIT``. ``gpu``: jobs queued for or on the gpu pool, which bounds
    claim-ready and where a gpu slot looks for jobs to batch (``workers.voicy.gather``).
    """

    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._reserve = client.register_script(_RESERVE)
        self._adopt = client.register_script(_ADOPT)
        self._incoming = client.register_script(_INCOMING)

    # --- backlog --------------------------------------------------------------------
    def reserve_backlog(self, limit: int) -> str | None:
        """Reserve one backlog slot before claiming; None when the fleet is at its limit."""
        now = time.time()
        slot = f"reservation:{uuid.uuid4().hex}"
        ok = self._reserve(keys=[BACKLOG_KEY], args=[now, limit, now + RESERVATION_TTL_S, slot])
        return slot if ok else None

    def cancel_backlog(self, slot: str) -> None:
        self.r.zrem(BACKLOG_KEY, slot)

    def backlog_size(self) -> int:
        self.r.zremrangebyscore(BACKLOG_KEY, "-inf", f"({time.time()}")
        return int(self.r.zcard(BACKLOG_KEY))

    def leave_backlog(self, job_id: str) -> None:
        if self.r.zrem(BACKLOG_KEY, job_id):
            self.notify()

    # --- waking an idle bridge -----------------------------------------------------------
    def notify(self) -> None:
        """Tell a waiting bridge that capacity freed up (so it claims now, not at its next poll)."""
        pipe = self.r.pipeline()
        pipe.lpush(WAKE_KEY, "1")
        pipe.ltrim(WAKE_KEY, 0, 0)
        pipe.execute()

    def wait_for_capacity(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` for a capacity notification; True if one came."""
        return self.r.blpop([WAKE_KEY], timeout=max(timeout_s, 0.01)) is not None

    # --- gpu slots --------------------------------------------------------------------
    def enter_gpu(self, job_id: str) -> None:
        self.r.zadd(GPU_KEY, {job_id: time.time()})

    def leave_gpu(self, job_id: str) -> None:
        if self.r.zrem(GPU_KEY, job_id):
            self.notify()

    def gpu_load(self) -> int:
        """Jobs queued for or running on the gpu pool, plus downloads that will need a slot."""
        return int(self.r.zcard(GPU_KEY))

    def gpu_ids(self, limit: int) -> list[str]:
        """Up to ``limit`` jobs of the gpu set, the longest waiting first."""
        return _names(self.r.zrange(GPU_KEY, 0, limit - 1))

    def incoming(self) -> int:
        """Jobs on their way to the gpu: claimed, their download not done yet."""
        return int(self._incoming(keys=[BACKLOG_KEY, GPU_KEY]))

    # --- held jobs --------------------------------------------------------------------
    def adopt(self, job: HeldJob, *, slot: str | None, gpu: bool, lease_key: str, lease_value: str,
              lease_ttl_s: float) -> None:
        """Record a freshly claimed job and grant its lease in one Redis transaction (a Lua script).

        All or nothing, because a process killed (or a Redis error) between the
        steps would leave a claimed job that is not ``held`` — which no heartbeat
        or reaper ever sees, so it stays ``downloading`` at Voicy — and, for a
        download, a backlog slot filled by it for ever. ``slot`` is the backlog
        reservation the claim was made under (None for a claim-ready recovery);
        ``gpu`` puts the job on the gpu set now (its transcription is sent next).
        """
        job.claimed_at = job.claimed_at or time.time()
        self._adopt(keys=[RECORD_PREFIX + job.job_id, HELD_KEY, BACKLOG_KEY, GPU_KEY, lease_key],
                    args=[job.job_id, job.model_dump_json(), job.claimed_at, slot or "",
                          time.time() if gpu else "", lease_value, max(1, int(lease_ttl_s * 1000))])

    def update(self, job: HeldJob) -> None:
        self.r.set(RECORD_PREFIX + job.job_id, job.model_dump_json())

    def get(self, job_id: str) -> HeldJob | None:
        raw = self.r.get(RECORD_PREFIX + job_id)
        return HeldJob.model_validate_json(raw) if raw else None

    def get_many(self, job_ids: list[str]) -> list[HeldJob | None]:
        """The records of ``job_ids`` in one round trip (``None`` where a job has none)."""
        raws = self.r.mget([RECORD_PREFIX + job_id for job_id in job_ids]) if job_ids else []
        return [HeldJob.model_validate_json(raw) if raw else None for raw in raws]

    def is_held(self, job_id: str) -> bool:
        return self.r.zscore(HELD_KEY, job_id) is not None

    def held_ids(self) -> list[str]:
        return _names(self.r.zrange(HELD_KEY, 0, -1))

    def forget(self, job_id: str) -> None:
        """The job has ended for us (result, failure, handed back): drop every trace."""
        pipe = self.r.pipeline()
        pipe.delete(RECORD_PREFIX + job_id)
        pipe.zrem(HELD_KEY, job_id)
        pipe.zrem(BACKLOG_KEY, job_id)
        pipe.zrem(GPU_KEY, job_id)
        pipe.execute()
        self.notify()


def _names(members: Iterable[Any]) -> list[str]:
    """A sorted set's members as text (a client without ``decode_responses`` returns bytes)."""
    return [m.decode() if isinstance(m, bytes) else m for m in members]
