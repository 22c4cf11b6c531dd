"""``JobContext``: the per-process objects every Cairn handler uses, built once after fork."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

import httpx

from workers.cairn.claimcheck import ClaimCheck
from workers.cairn.nats_conn import REQUEST_TIMEOUT_S, CoreRequestError, NatsThread, request_json
from workers.cairn.pool import PoolContext
from workers.cairn.ratelimit import RateLimiter
from workers.cairn.routing import PUBLISH_TIMEOUT_S
from workers.cairn.settings import load_cairn_settings
from workers.providers.registry import get_provider
from workers.redisconn import sync_client

log = logging.getLogger(__name__)

BLOB_HTTP_TIMEOUT_S = 30.0  # presigned PUT/GET of one body (reference §3.9)


@dataclasses.dataclass(frozen=True)
class Delivery:
    """The facts of one JetStream delivery the bridge handed to the task."""

    attempt: int = 1
    stream_seq: int = 0
    subject: str = ""
    lost: Callable[[], bool] | threading.Event | None = None

    @classmethod
    def coerce(cls, value: Delivery | int | dict[str, Any] | None) -> Delivery:
        if isinstance(value, Delivery):
            return value
        if isinstance(value, dict):
            return cls(attempt=int(value.get("attempt") or value.get("delivery") or 1),
                       stream_seq=int(value.get("stream_seq") or value.get("seq") or 0),
                       subject=str(value.get("subject") or ""))
        return cls(attempt=max(1, int(value or 1)))

    @property
    def is_lost(self) -> bool:
        """True when the task's lease was lost (another copy may own the job now)."""
        lost = self.lost
        if lost is None:
            return False
        if isinstance(lost, threading.Event):
            return lost.is_set()
        try:
            return bool(lost())
        except Exception:  # noqa: BLE001 - a broken probe must not fail the job
            return False


@dataclasses.dataclass
class JobContext(PoolContext):
    """Everything a handler needs, shared by every job of the process.

    The NATS thread, the provider's pooled HTTP client, the Redis client, the rate limiter and
    the claim-check are expensive to create and safe to reuse, so ``build_context()`` makes them
    once, lazily after the prefork fork. Per-delivery facts travel in :class:`Delivery`. Every
    handler reaches core through ``request``, ``publish`` and ``claimcheck`` here.

    The pool's identity (``worker_name``, ``worker_stamp``, ``core_gate``, ...) comes
    from :class:`~workers.cairn.pool.PoolContext`, the shape the presence context has too.
    """

    redis: Any  # redis.Redis, reconcile coalescing
    http: httpx.Client  # the provider's pooled client
    limiter: Any = None  # workers.cairn.ratelimit limiter (None: run without a shared budget)
    blob_http: httpx.Client | None = None  # presigned PUT/GET; None: the claim-check opens one on first use
    _claimcheck: ClaimCheck | None = dataclasses.field(default=None, repr=False)

    # ------------------------------------------------------------------ NATS

    @property
    def claimcheck(self) -> ClaimCheck:
        """Presign → PUT → publish for this pool; it stamps every result it publishes."""
        if self._claimcheck is None:
            self._claimcheck = ClaimCheck(self.nats, provider=self.provider_name, stamp=self.worker_stamp,
                                          http=self.blob_http)
        return self._claimcheck

    def request(self, subject: str, body: dict[str, Any], timeout_s: float = REQUEST_TIMEOUT_S) -> dict[str, Any]:
        """Core request/reply with a JSON body; the reply must be a JSON object."""
        return request_json(self.nats, subject, body, timeout_s)

    def publish(self, subject: str, data: bytes, msg_id: str, timeout_s: float = PUBLISH_TIMEOUT_S) -> None:
        """Publish with ``Nats-Msg-Id``: JetStream (dedup hit = success) when a stream captures
        ``subject``, core NATS otherwise (contract §5 publish routing, decided once per subject)."""
        self.claimcheck.router.publish(subject, data, msg_id, timeout_s=timeout_s)


_context: JobContext | None = None
_context_lock = threading.Lock()


def build_context(settings: Any = None) -> JobContext:
    """The process's context, built on first use (after fork)."""
    global _context
    with _context_lock:
        if _context is None or settings is not None:
            _context = _build(settings)
        return _context


def reset_context() -> None:
    """Forget the context (``worker_process_init`` in a forked child, tests)."""
    global _context
    with _context_lock:
        _context = None


def _build(settings: Any) -> JobContext:
    settings = settings or load_cairn_settings()
    provider = get_provider(str(settings.provider), settings)
    nats_thread = NatsThread(settings)
    redis_url = str(settings.redis_url)
    # The limiter opens the cairn_rate_limits bucket on first use, from the calling thread; if
    # core has not created it yet, that job fails transiently and is retried, rather than this
    # process running without the shared budget for the rest of its life.
    limiter = RateLimiter(nats_thread, settings, provider.rate_windows())  # the provider's windows
    return JobContext(settings=settings, nats=nats_thread, redis=sync_client(redis_url),
                      provider=provider, http=provider.new_http_client(), limiter=limiter,
                      blob_http=httpx.Client(timeout=BLOB_HTTP_TIMEOUT_S))


# --------------------------------------------------------------------------- subjects
# Re-exported from ``workers.cairn.contract.subjects`` so handlers import one place.
from workers.cairn.contract.subjects import (  # noqa: E402
    creds_subject,
    job_subject,
    reconcile_result_subject,
    result_subject,
    token_subject,
)

__all__ = ["CoreRequestError", "Delivery", "JobContext", "build_context", "creds_subject", "job_subject",
           "reconcile_result_subject", "reset_context", "result_subject", "token_subject"]
