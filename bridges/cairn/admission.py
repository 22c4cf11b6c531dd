"""Admission: the one decision point for every message the bridge pulls (C2, C4)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from workers.cairn import outcomes
from workers.cairn.contract.jobs import parse_job, parser_refusal
from workers.cairn.contract.subjects import PARSE_BLOB
from workers.cairn.disposition import (
    HISTORY_UNAVAILABLE_NAK_DELAY_S,
    PARSER_REFUSED_NAK_DELAY_S,
    Disposition,
    nak,
    term,
)
from workers.cairn.outcomes import MessageKey
from workers.lease import LeaseState, LeaseView, view
from workers.outage import REDIS_UNAVAILABLE, Outage

log = logging.getLogger(__name__)

REASON_MAX_CHARS = 200
INVALID_INPUT = "ERROR_CLASS_INVALID_INPUT"
TRANSIENT = "ERROR_CLASS_TRANSIENT"
_REF_FIELDS = ("job_id", "account_id", "user_id", "ext_id")
_SAFE_TOKEN = re.compile(r"[A-Za-z0-9_:-]{1,128}")


# --------------------------------------------------------------------------- inputs


class Delivered(Protocol):
    """What :meth:`DeliveryMeta.from_msg` reads of a delivery (nats-py's ``Msg``; a test's stub)."""

    @property
    def subject(self) -> str: ...

    @property
    def metadata(self) -> Any: ...


@dataclass(frozen=True)
class DeliveryMeta:
    """What JetStream says about one delivery, and the consumer kind that pulled it."""

    kind: str
    stream: str
    seq: int
    stamp: float  # stream timestamp, seconds since the epoch: the same on every redelivery
    delivered: int  # num_delivered, 1 on the first delivery
    subject: str = ""

    @property
    def key(self) -> MessageKey:
        return MessageKey(self.stream, self.seq, self.stamp)

    @classmethod
    def from_msg(cls, kind: str, msg: Delivered) -> DeliveryMeta:
        md = msg.metadata
        return cls(kind=kind, stream=str(md.stream), seq=int(md.sequence.stream),
                   stamp=md.timestamp.timestamp(), delivered=int(md.num_delivered), subject=msg.subject)


@dataclass(frozen=True)
class History:
    """What the fleet remembers of the message: failed deliveries, a recorded outcome, its lease."""

    failures: int = 0
    outcome: Disposition | None = None
    lease: LeaseView = field(default_factory=lambda: LeaseView(LeaseState.ABSENT))


Recall = Callable[[DeliveryMeta], Awaitable[History]]


class RedisRecall:
    """Reads a message's :class:`History` in one ``MGET`` (failure count, outcome, lease).

    A first delivery has no history (nothing ran before it): no Redis read at all.
    """

    def __init__(self, client: Any, lease_key: Callable[[str], str], *, redis_outage: Outage | None = None) -> None:
        self._r = client  # redis.asyncio.Redis
        self._lease_key = lease_key  # workers.lease.Leases.key of the Cairn namespace
        self._outage = redis_outage or Outage("Redis")

    async def __call__(self, meta: DeliveryMeta) -> History:
        if meta.delivered <= 1:
            return History()
        key = meta.key
        try:
            failures, outcome, lease = await self._r.mget(
                outcomes.failures_key(key), outcomes.ledger_key(key), self._lease_key(key.id))
        except REDIS_UNAVAILABLE as exc:
            self._outage.failed("message history read", exc)  # logged once per outage
            raise
        self._outage.ok()
        try:
            count = int(failures or 0)
        except ValueError:
            count = 0
        return History(count, outcomes.decode(outcome), view(lease))


@dataclass(frozen=True)
class Rules:
    term_after_deliveries: int
    max_deliver: int  # -1: unlimited


def gives_up(failures: int, term_after_deliveries: int) -> bool:
    """Term on arrival once the job has failed ``term_after_deliveries - 1`` times.

    So a job that fails on every delivery is termed with its envelope on
    delivery ``term_after_deliveries`` (the 5th by default), while deliveries
    that only waited (rate limit, refusal, hand-over) add nothing.
    """
    return failures >= term_after_deliveries - 1


# --------------------------------------------------------------------------- kinds


def _never(_: Any) -> str | None:
    return None


def _model_dump(job: Any) -> dict[str, Any]:
    return job.model_dump(mode="json") if isinstance(job, BaseModel) else dict(job)


@dataclass(frozen=True)
class MessageKind:
    """How admission reads one consumer kind's messages; a second consumer kind plugs in with one.

    ``parse(raw) -> job`` raises on anything it cannot read (poison);
    ``refuse(job) -> reason | None`` leaves a job to another instance (a NAK that is
    no failure); ``dump(job) -> dict`` is what the task receives. ``envelopes``: whether a
    term publishes a §6 failure envelope first. A job does (it has an import-queue item
    and a result subject); a kind without either (webhook events) is termed without one.
    """

    name: str
    parse: Callable[[bytes], Any]
    refuse: Callable[[Any], str | None] = _never
    refused_delay_s: float = PARSER_REFUSED_NAK_DELAY_S
    dump: Callable[[Any], dict[str, Any]] = _model_dump
    envelopes: bool = True


def decode_object(raw: bytes) -> dict[str, Any]:
    """Strict UTF-8, JSON, an object: the shape of every Cairn message body."""
    value = json.loads(bytes(raw).decode("utf-8"))
    if not isinstance(value, dict):
        raise ValueError("payload is not a JSON object")
    return value


def job_kind(kind: str, parser_version: str) -> MessageKind:
    """The :class:`MessageKind` of a ``cairn.jobs.<kind>`` subject (contract §4 payloads)."""
    refuse: Callable[[Any], str | None] = _never
    if kind == PARSE_BLOB:
        def refuse(job: Any) -> str | None:
            return parser_refusal(job, parser_version)
    return MessageKind(kind, parse=lambda raw: parse_job(kind, decode_object(raw)), refuse=refuse)


# --------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Envelope:
    """The §6 failure envelope to publish before a term: code, message, class and the job's ref."""

    code: str
    message: str
    error_class: str
    ref: dict[str, str]


@dataclass(frozen=True)
class Dispatch:
    job: Any
    payload: dict[str, Any]  # what the task receives (the kind's dump of ``job``)
    history: History


@dataclass(frozen=True)
class Adopt:
    history: History


@dataclass(frozen=True)
class Settle:
    disposition: Disposition
    envelope: Envelope | None = None
    history: History = field(default_factory=History)
    recorded: bool = False  # the disposition was read from the outcome ledger


Verdict = Dispatch | Adopt | Settle


def safe_ref(raw: Mapping[str, Any]) -> dict[str, str]:
    """The correlation fields of an untrusted payload that can safely name a subject and a msg-id."""
    return {k: v for k in _REF_FIELDS if isinstance(v := raw.get(k), str) and _SAFE_TOKEN.fullmatch(v)}


def _raw_ref(raw: bytes, meta: DeliveryMeta) -> dict[str, str]:
    try:
        ref = safe_ref(decode_object(raw))
    except Exception:  # noqa: BLE001 - unreadable: the envelope names the stream position instead
        ref = {}
    # The envelope's msg-id names the job; a payload without a usable id gets its stream
    # position instead, or every such envelope would share one id and be deduplicated away.
    ref.setdefault("job_id", f"{meta.stream}-{meta.seq}")
    return ref


def describe_invalid(exc: BaseException) -> str:
    """A short, secret-free reason: field locations and error types, never input values."""
    if isinstance(exc, ValidationError):
        try:
            parts = [f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['type']}" for e in exc.errors()[:5]]
            return "; ".join(parts)[:REASON_MAX_CHARS]
        except Exception:  # noqa: BLE001 - describing must never fail the verdict
            return "ValidationError"
    if isinstance(exc, (RecursionError, UnicodeDecodeError, json.JSONDecodeError)):
        return type(exc).__name__  # their texts quote positions of the input; the type says enough
    return type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {str(exc)[:REASON_MAX_CHARS]}"


def _poison(raw: bytes, meta: DeliveryMeta, history: History, code: str, reason: str,
            envelopes: bool = True) -> Settle:
    message = f"poison {meta.kind} payload: {reason}"
    envelope = Envelope(code, message, INVALID_INPUT, _raw_ref(raw, meta)) if envelopes else None
    return Settle(term(f"{code}: {message}"), envelope, history)


def _give_up(raw: bytes, meta: DeliveryMeta, history: History, message: str, envelopes: bool = True) -> Settle:
    envelope = Envelope("max_deliveries", message, TRANSIENT, _raw_ref(raw, meta)) if envelopes else None
    return Settle(term(f"max_deliveries: {message}"), envelope, history)


# --------------------------------------------------------------------------- the decision


async def admit(raw: bytes, meta: DeliveryMeta, *, kinds: Mapping[str, MessageKind], recall: Recall,
                rules: Rules) -> Verdict:
    """The one verdict for one delivery (:class:`Dispatch`, :class:`Adopt` or :class:`Settle`); never raises.

    In this order, each rule only if none before applied: (1) on a redelivery, the history
    (one Redis round trip): a recorded outcome is applied, a running lease is adopted; (2) the
    kind's parser: invalid UTF-8, a non-object, deep nesting, pydantic errors are poison;
    (3) the last delivery a finite ``CAIRN_MAX_DELIVER`` allows → envelope + term; (4) the
    kind's refusal → NAK, no failure; (5) ``CAIRN_TERM_AFTER_DELIVERIES - 1`` failures →
    envelope + term; (6) dispatch. Any exception in 2-5 is poison: envelope + term, never a
    NAK loop; the handler judges nothing again.
    """
    try:
        history = await recall(meta)
    except Exception as exc:  # noqa: BLE001 - Redis unreachable: not the job's failure, try again later
        # Unknown history is never "no history": running the job now could run it twice.
        (log.debug if isinstance(exc, REDIS_UNAVAILABLE) else log.warning)(
            "history of %s seq %d unavailable: %s", meta.kind, meta.seq, type(exc).__name__)
        return Settle(nak(HISTORY_UNAVAILABLE_NAK_DELAY_S, reason="message history unavailable", failure=False))
    try:
        return _judge(raw, meta, history, kinds, rules)
    except Exception as exc:  # noqa: BLE001 - anything we cannot classify is poison, never a loop
        kind = kinds.get(meta.kind)
        return _poison(raw, meta, history, "bad_payload", f"unclassifiable: {type(exc).__name__}",
                       envelopes=kind.envelopes if kind is not None else True)


def _judge(raw: bytes, meta: DeliveryMeta, history: History, kinds: Mapping[str, MessageKind],
           rules: Rules) -> Verdict:
    if history.outcome is not None:
        return Settle(history.outcome, history=history, recorded=True)
    if history.lease.state is LeaseState.RUNNING:
        return Adopt(history)
    kind = kinds.get(meta.kind)
    if kind is None:
        return _poison(raw, meta, history, "unsupported_job", "this pool does not serve it")
    try:
        job = kind.parse(raw)
    except Exception as exc:  # noqa: BLE001 - RecursionError, UnicodeDecodeError, ValidationError, ...
        return _poison(raw, meta, history, "bad_payload", describe_invalid(exc), kind.envelopes)
    if 0 < rules.max_deliver <= meta.delivered:  # JetStream would drop a NAK of its last delivery silently
        return _give_up(raw, meta, history,
                        f"delivery {meta.delivered} is the last CAIRN_MAX_DELIVER allows; giving up", kind.envelopes)
    refusal = kind.refuse(job)
    if refusal:  # left for a newer instance: not a failure of the job
        return Settle(nak(kind.refused_delay_s, reason=refusal, failure=False), history=history)
    if gives_up(history.failures, rules.term_after_deliveries):
        return _give_up(raw, meta, history,
                        f"failed on {history.failures} of {meta.delivered} deliveries; giving up", kind.envelopes)
    return Dispatch(job, kind.dump(job), history)
