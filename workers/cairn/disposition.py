"""What a Cairn job task returns: the disposition the bridge applies to the NATS message.

Why a model and not an exception: the bridge holds the JetStream message, the
task only knows the outcome. Returning a small JSON-able value through the
Celery result backend keeps that split honest (the task never touches the
message) and keeps secrets out of results: a ``Disposition`` has an action, a
delay and a short human reason, nothing else. Reasons are built from error
classes and codes, never from provider responses or tokens.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from workers.logs import redact

REASON_MAX_CHARS = 300  # a reason is a log hint, not a payload
MAX_NAK_DELAY_S = 24 * 3600.0 + 60.0  # a daily window plus grace is the longest wait we anchor to

Action = Literal["ack", "nak", "term"]


class Disposition(BaseModel):
    """``ack`` (done), ``nak`` (redeliver, optionally after ``delay_s``) or ``term`` (never again)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    action: Action
    delay_s: float | None = Field(default=None, ge=0.0)
    reason: str = ""

    @field_validator("reason", mode="before")
    @classmethod
    def _short_and_redacted(cls, value: object) -> str:
        text = redact(str(value or ""))
        return text[:REASON_MAX_CHARS]

    @field_validator("delay_s")
    @classmethod
    def _bounded(cls, value: float | None) -> float | None:
        return None if value is None else min(float(value), MAX_NAK_DELAY_S)


def ack(reason: str = "") -> Disposition:
    return Disposition(action="ack", reason=reason)


def nak(delay_s: float | None = None, reason: str = "") -> Disposition:
    """Redeliver; ``delay_s`` anchors a rate-limit wait to the real window reset."""
    return Disposition(action="nak", delay_s=delay_s, reason=reason)


def term(reason: str) -> Disposition:
    """Never redeliver (after the failure envelope was published, contract §6)."""
    return Disposition(action="term", reason=reason)
