"""What a Cairn job task returns: the disposition the bridge applies to the NATS message."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from workers.logs import redact

REASON_MAX_CHARS = 300  # a reason is a log hint, not a payload

# --- every NAK delay, with its reason ---------------------------------------------------------
# No NAK goes out faster than this (the bridge applies it to every NAK, the rate limiter to its
# waits): consumers have unlimited MaxDeliver, so an instant NAK would be redelivered in a hot loop.
# Every NAK delay of the Cairn side is named here, with its reason; only rate-limit waits (anchored
# to the real window reset) and core's credentials hint are computed. None is below MIN_NAK_DELAY_S.
MIN_NAK_DELAY_S = 1.0
MAX_NAK_DELAY_S = 24 * 3600.0 + 60.0  # a daily window plus grace is the longest wait we anchor to
# The job goes to another owner (its lease was lost or never granted to this task, the bridge
# stops or revoked a task that never started, a shutdown grace ran out): nothing is wrong with the
# job, so it comes back as soon as the floor allows.
HANDOVER_NAK_DELAY_S = MIN_NAK_DELAY_S
# A task died mid-run (its lease expired without an outcome): the next delivery runs it again
# at once; it counts as a failure, so a job that kills its worker every time still ends in a term.
LOST_TASK_NAK_DELAY_S = MIN_NAK_DELAY_S
TASK_FAILURE_NAK_DELAY_S = 2.0  # a task raised or returned no valid disposition: soon, but no hot loop
# A transient failure (provider 5xx or timeout, claim-check step, core's credentials without a
# retry hint): a plain NAK without delay would hot-loop (reference §6 #21).
TRANSIENT_NAK_DELAY_S = 5.0
UNEXPECTED_NAK_DELAY_S = 30.0  # a bug in a handler: slow down; the bridge terms after ~5 deliveries anyway
# The failure envelope could not be published: never term without it (core would mask the cause),
# so the job comes back soon and the envelope is tried again.
ENVELOPE_FAILED_NAK_DELAY_S = 5.0
# Redis is unreachable: the message can be neither granted, sent nor judged (its history is
# unknown, and unknown is never "none"). Not the job's failure; back when Redis likely is.
REDIS_DOWN_NAK_DELAY_S = 5.0
HISTORY_UNAVAILABLE_NAK_DELAY_S = REDIS_DOWN_NAK_DELAY_S  # admission's history read, the same outage
PARSER_REFUSED_NAK_DELAY_S = 30.0  # a parse_blob for a newer parser or dataset: left to a newer instance
# A task this worker's release cannot read (a newer argument shape, a job kind it has no handler for):
# left to a worker of the release that sent it, as a parser refusal is (a rolling upgrade, docs/operations.md §6).
RELEASE_REFUSED_NAK_DELAY_S = PARSER_REFUSED_NAK_DELAY_S
WEBHOOK_PUBLISH_NAK_DELAY_S = 5.0  # core or JetStream did not take a webhook's fetch/delete publish
# Webhook updates are held until their coalescing bucket closes: the wait is the bucket's rest,
# never below the floor (``WebhookJob.not_before``).
COALESCE_MIN_NAK_DELAY_S = MIN_NAK_DELAY_S

Action = Literal["ack", "nak", "term"]


class Disposition(BaseModel):
    """``ack`` (done), ``nak`` (redeliver, optionally after ``delay_s``) or ``term`` (never again).

    A value, not an exception: the bridge holds the JetStream message and the task only knows
    the outcome, so it returns this through the result backend and never touches the message.
    It holds an action, a delay and a short reason built from error classes, never a secret.

    ``counts_as_failure`` only means something on a NAK; it defaults to True so
    a disposition from an older task image (without the field) counts as it
    always did, and it is forced False on ``ack``/``term``.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    action: Action
    delay_s: float | None = Field(default=None, ge=0.0)
    reason: str = ""
    counts_as_failure: bool = True

    @field_validator("reason", mode="before")
    @classmethod
    def _short_and_redacted(cls, value: object) -> str:
        text = redact(str(value or ""))
        return text[:REASON_MAX_CHARS]

    @field_validator("delay_s")
    @classmethod
    def _bounded(cls, value: float | None) -> float | None:
        """A wait is never below the floor (an instant NAK hot-loops) nor above a day and a bit."""
        return None if value is None else min(max(float(value), MIN_NAK_DELAY_S), MAX_NAK_DELAY_S)

    @model_validator(mode="before")
    @classmethod
    def _only_naks_fail(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("action") in ("ack", "term"):
            return {**data, "counts_as_failure": False}
        return data


def ack(reason: str = "") -> Disposition:
    return Disposition(action="ack", reason=reason)


def nak(delay_s: float | None = None, reason: str = "", *, failure: bool = True) -> Disposition:
    """Redeliver; ``delay_s`` anchors a rate-limit wait to the real window reset.

    ``failure=False`` for a NAK that only waits or hands the job on (rate limit,
    parser refusal, lease hand-over): it does not bring the job closer to its term
    (``CAIRN_TERM_AFTER_DELIVERIES``, contract §3 "persistently failing"), or a reconcile's
    sub-jobs waiting out a provider budget would be termed. A forgotten flag counts: the safe side.
    """
    return Disposition(action="nak", delay_s=delay_s, reason=reason, counts_as_failure=failure)


def term(reason: str) -> Disposition:
    """Never redeliver (after the failure envelope was published, contract §6)."""
    return Disposition(action="term", reason=reason)
