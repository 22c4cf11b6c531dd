"""Provider webhooks (contract §9a, reference §2.13/§3.14): the generic half that names no provider."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workers.cairn.contract import subjects
from workers.cairn.disposition import COALESCE_MIN_NAK_DELAY_S, WEBHOOK_PUBLISH_NAK_DELAY_S, Disposition, ack, nak, term
from workers.cairn.pool import PoolContext
from workers.cairn.refusals import PermissionRefused
from workers.logs import describe
from workers.providers.kinds import WEBHOOK_EVENT
from workers.providers.webhooks import DELETE, FETCH, IGNORE, WEBHOOK_REASON, VerifyReply, WebhookJob, WebhookRules

log = logging.getLogger(__name__)

KIND = WEBHOOK_EVENT  # the consumer kind the bridge registers for CAIRN_WEBHOOKS
LOOKUP_TIMEOUT_S = 1.0  # as the Strava worker: a webhook is best effort, the reconcile catches up
NEEDS_REAUTH_TIMEOUT_S = 5.0
DEAUTHORIZED_REASON = "deauthorized"
DELETE_TAG_PREFIX = "d"  # a deletion's fetch: ``webhook:…:<object>:d<event_time>``
MAX_LOG_TOKEN_CHARS = 64


# --------------------------------------------------------------------------- wire

class WebhookEnvelope(BaseModel):
    """Core's envelope for ``POST /webhooks/<worker_key>``, on ``cairn.webhooks.<worker_key>.event``.

    ``body`` is the raw provider body, base64 on the wire."""

    model_config = ConfigDict(extra="ignore")

    provider: str = ""
    headers: dict[str, str] = Field(default_factory=dict)
    body: str


def decode_envelope(data: bytes) -> tuple[WebhookEnvelope, bytes]:
    """The envelope and its decoded body; ``ValueError`` on anything else."""
    try:
        env = WebhookEnvelope.model_validate_json(data)
        return env, base64.b64decode(env.body, validate=True)
    except (ValidationError, binascii.Error) as exc:
        raise ValueError(f"undecodable webhook envelope ({type(exc).__name__})") from None


def verify_response(rules: WebhookRules | None, data: bytes) -> bytes:
    """The reply to one handshake core relays as ``{"method": "GET", "query": {…}}`` on
    ``cairn.webhooks.<worker_key>.verify``: ``{status, content_type, body (base64)}`` JSON bytes, always valid."""
    if rules is None:
        reply = VerifyReply(503, "text/plain; charset=utf-8", b"this pool takes no webhooks")
    else:
        try:
            request = json.loads(data or b"{}")
            raw_query = request.get("query") if isinstance(request, dict) else None
            query = {str(k): str(v) for k, v in (raw_query or {}).items()} if isinstance(raw_query, dict) else {}
        except ValueError:
            query = {}
        reply = rules.verify(query)
    return json.dumps(reply.to_wire(), separators=(",", ":")).encode()


def webhook_job_id(provider: str, worker_name: str, owner_id: str, object_id: str, tag: str) -> str:
    """``webhook:<provider>:<pool>:<owner>:<object>:<tag>``: the sub-job's ``job_id`` and ``Nats-Msg-Id``.

    Deterministic, so a redelivered event, Strava's retry of one delivery and a
    coalesced burst all land on one job inside CAIRN_JOBS' dedup window; the
    pool is part of it because the window spans every pool's subjects.
    """
    return f"webhook:{provider}:{worker_name}:{owner_id}:{object_id}:{tag}"


# --------------------------------------------------------------------------- lookup

@dataclass(frozen=True)
class Account:
    account_id: str
    user_id: str


class CoreLink(Protocol):
    """What a webhook job uses of its :class:`JobContext`: the pool's names and core's request/publish."""

    @property
    def provider_name(self) -> str: ...

    @property
    def worker_name(self) -> str: ...

    def request(self, subject: str, body: dict[str, Any], timeout_s: float = ...) -> dict[str, Any]: ...

    def publish(self, subject: str, data: bytes, msg_id: str, timeout_s: float = ...) -> None: ...


def lookup_account(ctx: CoreLink, owner_id: str, subscription_id: str) -> tuple[Account | None, str]:
    """Resolve the owner on the pool's lookup subject; (account, "") or (None, why).

    An event names the provider's owner, not a Cairn account. Any error, or a timeout, drops the event."""
    body: dict[str, Any] = {"external_id": owner_id}
    if subscription_id:
        body["subscription_id"] = subscription_id
    subject = subjects.account_lookup_subject(ctx.provider_name, ctx.worker_name)
    try:
        reply = ctx.request(subject, body, LOOKUP_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - timeout, no responder, refusal: drop the event
        return None, f"lookup failed ({type(exc).__name__})"
    error = reply.get("error")
    if error:
        return None, str(error)[:MAX_LOG_TOKEN_CHARS]
    account_id, user_id = reply.get("account_id"), reply.get("user_id")
    if not isinstance(account_id, str) or not account_id or not isinstance(user_id, str) or not user_id:
        return None, "lookup reply without account_id/user_id"
    return Account(account_id, user_id), ""


# --------------------------------------------------------------------------- admission and handler

def parse_event(raw: bytes, rules: WebhookRules | None) -> WebhookJob:
    """Admission's parser for the webhook consumer kind: envelope → provider event → job.

    Raises on anything undecodable (the bridge's admission then terms the message,
    without an envelope for this kind: never a redelivery loop).
    """
    if rules is None:
        raise ValueError("this pool has no webhook rules")
    _, body = decode_envelope(raw)
    return rules.classify(body)


def handle_event(ctx: CoreLink, job: WebhookJob | dict[str, Any], delivery: Any, *,
                 now: Callable[[], float] = time.time) -> Disposition:
    """Run one admitted webhook job (``workers.cairn.handlers.HANDLERS[KIND]``); the bridge applies the result.

    A failed lookup is acked and dropped with one log line (Strava does not redeliver; the next reconcile
    catches up). A failed publish is a transient NAK; one NATS refuses is a term, reported once."""
    job = job if isinstance(job, WebhookJob) else WebhookJob.model_validate(job)
    if job.action == IGNORE:
        log.info("webhook ignored: %s", job.reason)
        return ack(f"ignored: {job.reason}")
    if job.action == FETCH and job.not_before is not None:
        wait_s = job.not_before - now()
        if wait_s > 0:  # coalescing: not a failure, the burst's bucket is still open
            return nak(max(wait_s, COALESCE_MIN_NAK_DELAY_S), reason="coalescing updates", failure=False)
    account, why = lookup_account(ctx, job.owner_id, job.subscription_id)
    if account is None:
        log.info("webhook for %s owner %s dropped: %s", ctx.provider_name, job.owner_id, why)
        return ack(f"dropped: {why}")
    try:
        return _apply(ctx, job, account)
    except PermissionRefused as exc:  # permanent: reported once by the connection; a NAK would loop
        return term(f"webhook {job.action}: {exc}")
    except Exception as exc:  # noqa: BLE001 - every other publish failure is transient
        log.warning("webhook %s not published: %s", job.action, describe(exc))
        return nak(WEBHOOK_PUBLISH_NAK_DELAY_S, reason=f"transient: {type(exc).__name__}")


def _enqueue_fetch(ctx: CoreLink, job: WebhookJob, account: Account, tag: str) -> str:
    """A ``fetch_source`` sub-job on the pool's own job subject (contract §3: webhooks enqueue there)."""
    provider = ctx.provider_name
    job_id = webhook_job_id(provider, ctx.worker_name, job.owner_id, job.object_id, tag)
    body = {"job_id": job_id, "account_id": account.account_id, "user_id": account.user_id,
            "provider": provider, "ext_id": job.object_id, "fetch_streams": True, "reason": WEBHOOK_REASON}
    ctx.publish(subjects.job_subject(subjects.FETCH_SOURCE, provider, ctx.worker_name),
                json.dumps(body, separators=(",", ":")).encode(), job_id)
    return job_id


def _apply(ctx: CoreLink, job: WebhookJob, account: Account) -> Disposition:
    """Publish what the action means, only on subjects core's permission template grants (contract §1)."""
    provider = ctx.provider_name
    if job.action == FETCH:
        _enqueue_fetch(ctx, job, account, job.tag)
        log.info("webhook: fetch_source %s enqueued for account %s", job.object_id, account.account_id)
        return ack(f"fetch enqueued ({job.tag})")
    if job.action == DELETE:
        # Contract 0.7 defines no deletion subject (the published worker's
        # cairn.events.source.deleted_upstream is outside core's template, and core has no
        # subscriber for it). What it does define: webhooks enqueue fetch_source on the pool's own
        # subject, and a fetch that can never succeed ends in a §6 failure envelope. So the
        # deletion is fetched: the provider answers not found, and core receives a NOT_FOUND
        # envelope naming the account and activity on the pool's result subject.
        _enqueue_fetch(ctx, job, account, job.tag or f"{DELETE_TAG_PREFIX}{job.event_time}")
        log.info("webhook: source %s deleted upstream (account %s); fetch_source enqueued so core hears "
                 "not_found", job.object_id, account.account_id)
        return ack("deleted upstream: fetch enqueued")
    reply = ctx.request(subjects.token_subject(provider, "needs_reauth"),
                        {"account_id": account.account_id, "reason": DEAUTHORIZED_REASON}, NEEDS_REAUTH_TIMEOUT_S)
    if reply.get("ok") is False:
        log.info("webhook: core refused needs_reauth for account %s: %s", account.account_id,
                 str(reply.get("error", ""))[:MAX_LOG_TOKEN_CHARS])
    else:
        log.info("webhook: account %s deauthorized upstream; core told", account.account_id)
    return ack("deauthorized")


# --------------------------------------------------------------------------- presence

CONSUMER_INFO_TIMEOUT_S = 5.0


def consumer_exists(ctx: PoolContext) -> bool:
    """Whether the pool's CAIRN_WEBHOOKS durable exists (the bridge creates it)."""
    js = ctx.nats.js  # resolved in the calling thread, never on the loop thread
    durable = subjects.webhook_durable_name(ctx.worker_name)

    async def info() -> None:
        await js.consumer_info(subjects.WEBHOOKS_STREAM, durable)

    try:
        ctx.nats.run(info(), CONSUMER_INFO_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - not found, no stream, NATS down: not taking webhooks
        return False
    return True


def enabled(rules: WebhookRules | None) -> bool:
    """Whether a provider's rules take events (None: the provider has no webhooks)."""
    return bool(rules is not None and rules.enabled)


def presence_flag(ctx: PoolContext) -> bool:
    """Contract §2 ``webhooks``: the provider's webhooks are on *and* the pool's consumer exists.

    Asked with the main process's presence context as well as a job context: both are a
    :class:`~workers.cairn.pool.PoolContext`, which has the provider and ``worker_name``.
    """
    return enabled(ctx.provider.webhook_rules()) and consumer_exists(ctx)
