"""The bridge's narrow view of ``workers.cairn``: settings, subjects, job models, envelopes.

Why a separate module: the bridge loop (``bridges/cairn.py``) should read as
the ack discipline and nothing else. Everything it needs from the contract
layer (names of subjects, which job kinds the pool consumes, job validation,
the failure envelope, dispositions) is reached through these few functions,
which only delegate to ``workers.cairn`` and ``workers.providers``.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from bridges.cairn_pool import JobConsumer, job_consumers
from workers.cairn import subjects
from workers.cairn.disposition import Disposition
from workers.cairn.disposition import nak as _nak
from workers.cairn.disposition import term as _term
from workers.cairn.jobs import PARSER_REFUSED_NAK_DELAY_S
from workers.cairn.settings import CairnSettings
from workers.cairn.subjects import JOB_KINDS, PARSE_BLOB
from workers.providers.base import Provider

if TYPE_CHECKING:
    from bridges.cairn import CairnBridge
    from bridges.cairn_ack import Held

REQUIRED_KINDS = (subjects.FETCH_SOURCE, subjects.RECONCILE)
BRIDGE_NAK_DELAY_S = 1.0  # the bridge's own NAKs (hand-over, lost task): soon, never at once
__all__ = ["PARSE_BLOB", "PARSER_REFUSED_NAK_DELAY_S", "Disposition"]


# --------------------------------------------------------------------------- settings


def build_provider(settings: CairnSettings) -> Provider:
    from workers.providers.registry import get_provider

    return get_provider(settings.provider, settings)


def queue_group(settings: CairnSettings) -> str:
    """Instances of one pool share requests; the pool name is the natural group."""
    return settings.worker_name


# --------------------------------------------------------------------------- subjects


def pool_consumers(settings: CairnSettings, provider: Provider) -> list[JobConsumer]:
    """fetch_source and reconcile always; the others (backfill: MAY) only when the provider declares them."""
    declared = set(provider.declared_capabilities().jobs)
    kinds = [k for k in JOB_KINDS if k in REQUIRED_KINDS or k in declared]
    name, prov = settings.worker_name, settings.provider
    return job_consumers(name, [(k, subjects.job_subject(k, prov, name)) for k in kinds])


def discover_subject(settings: CairnSettings) -> str:
    return subjects.discover_subject(settings.provider, settings.worker_name)


def exchange_subject(settings: CairnSettings) -> str:
    return subjects.oauth_exchange_subject(settings.provider, settings.worker_name)


def links_oauth_accounts(provider: Provider) -> bool:
    meta = provider.manifest_meta() or {}
    return meta.get("auth_method") == "oauth2"


# --------------------------------------------------------------------------- jobs


def parse_job(kind: str, raw: dict[str, Any]) -> Any:
    from workers.cairn.jobs import parse_job as parse

    return parse(kind, raw)


def describe_invalid(exc: Exception) -> str:
    """A short, secret-free reason: field locations and error types, never input values."""
    if isinstance(exc, ValidationError):
        parts = [f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['type']}" for e in exc.errors()[:5]]
        return "; ".join(parts)
    return type(exc).__name__ if not str(exc) else str(exc)[:200]


def parse_blob_refusal(provider: Provider, job: Any) -> str | None:
    """Why our parser must not take this parse_blob (contract §1), or None."""
    from workers.cairn.jobs import parser_refusal

    return parser_refusal(job, provider.parser_version)


# --------------------------------------------------------------------------- dispositions


def nak(reason: str, *, failure: bool, delay_s: float = BRIDGE_NAK_DELAY_S) -> Disposition:
    """A NAK the bridge builds itself. ``failure`` is required: only the bridge knows whether
    this delivery failed (a lost task) or merely waited or changed hands (a refusal, a
    shutdown, a task never started), and only failures bring the job closer to its term.
    The delay is never zero: consumers redeliver without limit, an instant NAK would spin."""
    return _nak(delay_s=delay_s, reason=reason, failure=failure)


def term(reason: str) -> Disposition:
    return _term(reason)


REVOKED = "REVOKED"  # Celery's state of a task revoked before it ran (start deadline, operator)


def disposition_from_meta(meta: dict[str, Any], failure_delay_s: float) -> Disposition:
    """The task's returned disposition; a task that raised is a delayed, failed NAK, one that
    was revoked before it ran is a delayed NAK that did not fail."""
    if meta.get("status") == "SUCCESS":
        try:
            return Disposition.model_validate(meta.get("result"))
        except ValidationError:
            return nak("task returned no valid disposition", failure=True, delay_s=failure_delay_s)
    status = meta.get("status")
    return nak(f"task ended {status}", failure=status != REVOKED, delay_s=failure_delay_s)


class LoopNats:
    """What a ``JobContext`` needs of a ``NatsThread`` (``run``, ``nc``, ``js``), on the bridge's loop.

    Lets the bridge reuse the handlers' failure-envelope code unchanged: that
    code is synchronous, so it runs in a worker thread and its coroutines are
    handed back to the bridge's event loop and connection.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, nc: Any, js: Any) -> None:
        self._loop, self.nc, self.js = loop, nc, js

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)


def envelope_context(settings: Any, provider: Provider, loop: asyncio.AbstractEventLoop, nc: Any,
                     js: Any) -> Any:
    from workers.cairn.handlers.context import JobContext

    return JobContext(settings=settings, nats=LoopNats(loop, nc, js), redis=None, provider=provider,
                      http=None, blob_http=None)  # type: ignore[arg-type]


_REF_FIELDS = ("job_id", "account_id", "user_id", "ext_id")
_SAFE_TOKEN = re.compile(r"[A-Za-z0-9_:-]{1,128}")


def safe_ref(raw: dict[str, Any]) -> dict[str, str]:
    """The correlation fields of an untrusted payload that can safely name a subject and a msg-id."""
    return {k: v for k in _REF_FIELDS if isinstance(v := raw.get(k), str) and _SAFE_TOKEN.fullmatch(v)}


async def terminate(bridge: CairnBridge, held: Held, raw: dict[str, Any], *, code: str, message: str,
                    error_class: str) -> Disposition:
    """Failure envelope (§6) then Term, for a job the bridge ends itself; NAK if the envelope fails."""
    from workers.cairn.handlers.context import Delivery
    from workers.cairn.handlers.failure import terminate as handlers_terminate

    delivery = Delivery(attempt=held.delivery, stream_seq=held.seq, subject=held.msg.subject)
    ref = safe_ref(raw)
    # The envelope's msg-id names the job; a payload without a usable id gets its stream
    # sequence instead, or every such envelope would share one id and be deduplicated away.
    ref.setdefault("job_id", f"{subjects.JOBS_STREAM}-{held.seq}")
    return await asyncio.to_thread(handlers_terminate, bridge.envelope_ctx, held.consumer.kind, ref,
                                   delivery, code=code, message=message, error_class=error_class)


# --------------------------------------------------------------------------- sealed


class SealedStore:
    """``workers.cairn.sealed`` bound to one Redis client (park → key, unpark reads-and-deletes)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def park(self, obj: Any, ttl_s: float) -> str:
        from workers.cairn.sealed import park

        return park(self._client, obj, ttl_s)

    def unpark(self, key: str) -> dict[str, Any] | None:
        """The parked object, or None when it is gone (taken, expired)."""
        from workers.cairn.sealed import unpark

        return unpark(self._client, key, missing_ok=True)

    def discard(self, key: str) -> None:
        from workers.cairn.sealed import discard

        discard(self._client, key)


def valid_discover_reply(reply: object) -> bool:
    from workers.cairn.handlers.discover import valid_discover_reply as valid

    return valid(reply)

