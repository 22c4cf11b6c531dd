"""Standing faults: what a component found broken for good, kept in Redis for the fleet's health verdict."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

log = logging.getLogger(__name__)

FAULTS_KEY = "sy:health:faults"  # a hash: field = component (e.g. ``cairn-pool/strava-fetcher``), value = JSON
DETAIL_MAX_CHARS = 500


class Fault(BaseModel):
    """One component's standing fault: what is broken and since when.

    Not an outage that ends by itself: a subject NATS refuses (``workers.cairn.refusals``)
    refuses every retry until an operator acts, so it is logged once where it happens and kept
    here for ``switchyard health``. One fault per component, the latest wins; a component clears
    its own when it starts cleanly again.
    """

    model_config = ConfigDict(frozen=True)

    component: str
    detail: str
    at: datetime

    def to_wire(self) -> str:
        """The hash value: ``{"detail", "at"}`` (the component is the field)."""
        return self.model_dump_json(include={"detail", "at"})


class _Stored(BaseModel):
    """The hash value as stored."""

    detail: str
    at: datetime


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def record_fault(redis_client: Any, component: str, detail: str) -> Fault:
    """Record (or replace) ``component``'s fault; returns it even when Redis did not take it.

    Takes a sync client and never raises on a Redis error: recording a fault must not turn a
    reported failure into a crash.
    """
    fault = Fault(component=component, detail=detail[:DETAIL_MAX_CHARS], at=datetime.now(UTC))
    try:
        redis_client.hset(FAULTS_KEY, component, fault.to_wire())
    except Exception as exc:  # noqa: BLE001 - Redis away: the log line already reported the fault
        log.debug("fault of %s not recorded: %s", component, type(exc).__name__)
    return fault


def clear_fault(redis_client: Any, component: str) -> None:
    """``component`` works again: forget its fault (no-op when it has none)."""
    try:
        redis_client.hdel(FAULTS_KEY, component)
    except Exception as exc:  # noqa: BLE001 - the next clean start clears it
        log.debug("fault of %s not cleared: %s", component, type(exc).__name__)


def read_faults(redis_client: Any) -> list[Fault]:
    """Every recorded fault, by component; an unreadable entry is reported as a fault of its own."""
    faults = []
    for raw_component, raw in sorted(redis_client.hgetall(FAULTS_KEY).items()):
        component = _text(raw_component)
        try:
            stored = _Stored.model_validate_json(raw)
        except ValidationError:
            faults.append(Fault(component=component, detail=f"unreadable fault record: {_text(raw)[:80]}",
                                at=datetime.now(UTC)))
            continue
        faults.append(Fault(component=component, detail=stored.detail, at=stored.at))
    return faults
