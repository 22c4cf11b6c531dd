"""Failure envelopes (contract §6) and the one mapping from errors to dispositions."""

from __future__ import annotations

import logging
from typing import Any

from workers.cairn.claimcheck import ClaimCheckError
from workers.cairn.contract import wire
from workers.cairn.contract.pb.cairn.worker.v1 import worker_pb2 as pb
from workers.cairn.contract.subjects import failure_msg_id
from workers.cairn.credentials import CredentialsRevoked, CredentialsUnavailable, report_needs_reauth
from workers.cairn.disposition import (
    ENVELOPE_FAILED_NAK_DELAY_S,
    RELEASE_REFUSED_NAK_DELAY_S,
    TRANSIENT_NAK_DELAY_S,
    UNEXPECTED_NAK_DELAY_S,
    Disposition,
    nak,
    term,
)
from workers.cairn.handlers.context import Delivery, JobContext, reconcile_result_subject, result_subject
from workers.cairn.refusals import PermissionRefused
from workers.errors import PermanentJobError, RetryableJobError
from workers.logs import redact
from workers.providers.errors import (
    ProviderAccountBlocked,
    ProviderAuthError,
    ProviderError,
    ProviderNotFound,
    ProviderPermanentError,
    ProviderRateLimited,
)
from workers.providers.kinds import RECONCILE

log = logging.getLogger(__name__)

MESSAGE_MAX_CHARS = 240
ERROR_CLASSES = frozenset({"ERROR_CLASS_TRANSIENT", "ERROR_CLASS_RATE_LIMITED", "ERROR_CLASS_AUTH_EXPIRED",
                           "ERROR_CLASS_AUTH_INVALID", "ERROR_CLASS_NOT_FOUND", "ERROR_CLASS_INVALID_INPUT",
                           "ERROR_CLASS_PROVIDER_DOWN", "ERROR_CLASS_WORKER_BUG"})


class Permanent(PermanentJobError):
    """A handler-level permanent failure with the envelope's code and class."""

    def __init__(self, code: str, message: str, error_class: str = "ERROR_CLASS_INVALID_INPUT") -> None:
        super().__init__(message)
        self.code, self.error_class = code, error_class


def _job_field(job: Any, name: str) -> str:
    """A correlation field of a parsed job, or of a raw payload the bridge could not parse."""
    value = job.get(name) if isinstance(job, dict) else getattr(job, name, "")
    return str(value or "")


def failure_envelope(ctx: JobContext, job: Any, *, code: str, message: str,
                     error_class: str = "ERROR_CLASS_INVALID_INPUT") -> pb.JobResult:
    """The §6 ``JobResult``: ``error`` and ``failed_ref`` (the claim-check adds the stamp).

    No events; the stamp is not required by §6 but C3 asks for it on every ``JobResult``.
    Messages are short and redacted, built from our own error texts.
    """
    if error_class not in ERROR_CLASSES:
        error_class = "ERROR_CLASS_INVALID_INPUT"
    return wire.failure_envelope(code=code or "failed", message=redact(message or "")[:MESSAGE_MAX_CHARS],
                                 user_id=_job_field(job, "user_id"), provider=ctx.provider_name,
                                 account_id=_job_field(job, "account_id"),
                                 external_id=_job_field(job, "ext_id"), error_class=error_class)


def publish_failure(ctx: JobContext, kind: str, job: Any, delivery: Delivery, *, code: str,
                    message: str, error_class: str = "ERROR_CLASS_INVALID_INPUT") -> None:
    """Publish the envelope on the job's result subject (msg-id ``failed:<p>:<ext|job>:d<n>``)."""
    envelope = failure_envelope(ctx, job, code=code, message=message, error_class=error_class)
    account_id = _job_field(job, "account_id")
    if kind == RECONCILE and account_id:
        subject = reconcile_result_subject(ctx.provider_name, account_id)
    else:
        subject = result_subject(kind, ctx.provider_name, ctx.worker_name)
    ident = _job_field(job, "ext_id") or _job_field(job, "job_id") or account_id
    ctx.claimcheck.publish_inline(subject, envelope, failure_msg_id(ctx.provider_name, ident, delivery.attempt))


def terminate(ctx: JobContext, kind: str, job: Any, delivery: Delivery, *, code: str, message: str,
              error_class: str = "ERROR_CLASS_INVALID_INPUT") -> Disposition:
    """Envelope then Term; if the envelope cannot be published, NAK (never Term silently).

    Unless NATS *refuses* the envelope's subject: that is permanent, and a NAK would loop for
    ever. The refusal was reported once, at ERROR, and recorded as a fault
    (``workers.cairn.refusals``); the job is termed without its envelope.
    """
    try:
        publish_failure(ctx, kind, job, delivery, code=code, message=message, error_class=error_class)
    except PermissionRefused as exc:
        log.info("%s job terminated without its failure envelope: %s", kind, exc)
        return term(f"{code}: {redact(message)[:MESSAGE_MAX_CHARS]}; no envelope: {exc}")
    except Exception as exc:  # noqa: BLE001 - no envelope, no Term: core would mask the cause
        log.warning("%s failure envelope not published (%s); nak", kind, type(exc).__name__)
        return nak(ENVELOPE_FAILED_NAK_DELAY_S, reason=f"failure envelope not published: {code}")
    log.info("%s job terminated: %s", kind, code)
    return term(f"{code}: {redact(message)[:MESSAGE_MAX_CHARS]}")


def disposition_for(ctx: JobContext, kind: str, job: Any, delivery: Delivery, exc: BaseException) -> Disposition:
    """The contract's ack discipline for an error raised by a handler (§3).

    A rate limit NAKs until the real window reset without counting as a failure; anything
    transient NAKs as a failed delivery; anything that can never succeed publishes a failure
    envelope and Terms, so core fails the item with the true reason, not "stale: no result".
    """
    if isinstance(exc, ProviderRateLimited):
        delay = exc.delay_s()
        log.info("%s rate limited (%s window); nak %.0fs", kind, exc.window, delay)
        return nak(delay, reason=f"rate_limited: {exc.window} window", failure=False)  # waiting is not failing
    if isinstance(exc, PermissionRefused):  # permanent: never a NAK loop (reported once by the connection)
        return terminate(ctx, kind, job, delivery, code=exc.code, message=str(exc), error_class=exc.error_class)
    if isinstance(exc, CredentialsUnavailable):
        return nak(exc.retry_after_s or TRANSIENT_NAK_DELAY_S, reason=str(exc))
    if isinstance(exc, CredentialsRevoked):
        return terminate(ctx, kind, job, delivery, code=exc.code, message=str(exc), error_class=exc.error_class)
    if isinstance(exc, ProviderAuthError):
        account_id = str(getattr(job, "account_id", "") or "")
        if account_id:
            report_needs_reauth(ctx, account_id, exc.code or "unauthorized")
        return terminate(ctx, kind, job, delivery, code=exc.code, message=str(exc), error_class=exc.error_class)
    if isinstance(exc, (ProviderNotFound, ProviderPermanentError, ProviderAccountBlocked, Permanent)):
        code = getattr(exc, "code", "invalid_input")
        error_class = getattr(exc, "error_class", "ERROR_CLASS_INVALID_INPUT")
        return terminate(ctx, kind, job, delivery, code=code, message=str(exc), error_class=error_class)
    if isinstance(exc, PermanentJobError):  # e.g. BadResult: our output does not fit the schema
        return terminate(ctx, kind, job, delivery, code=getattr(exc, "code", "invalid_input"),
                         message=str(exc), error_class="ERROR_CLASS_INVALID_INPUT")
    if isinstance(exc, (ClaimCheckError, ProviderError, RetryableJobError)):
        log.info("%s transient failure (%s); nak", kind, type(exc).__name__)
        return nak(TRANSIENT_NAK_DELAY_S, reason=f"transient: {type(exc).__name__}: {redact(str(exc))[:120]}")
    log.warning("%s unexpected failure %s; nak", kind, type(exc).__name__)
    return nak(UNEXPECTED_NAK_DELAY_S, reason=f"unexpected: {type(exc).__name__}")


def refused(why: str) -> Disposition:
    """A NAK (no failure) for a task this worker's release cannot read: a rolling upgrade's mismatch.

    Nothing is taken or recorded, as for another pool's job: the message waits
    ``RELEASE_REFUSED_NAK_DELAY_S`` and goes to a worker of the release that sent it. The
    line names the fix, since only a deploy in the wrong order sends what the workers cannot read.
    """
    log.warning("cairn job refused: %s; handed back (NAK %.0fs, not a failure) for a worker of the release "
                "that sent it (deploy workers before bridges)", why, RELEASE_REFUSED_NAK_DELAY_S)
    return nak(RELEASE_REFUSED_NAK_DELAY_S, reason=f"refused by this worker's release: {why}", failure=False)
