"""NATS permission refusals: permanent, reported once, never retried as an outage (contract §1)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from workers.errors import PermanentJobError

log = logging.getLogger(__name__)
T = TypeVar("T")

_REFUSAL = re.compile(r'permissions violation for (publish|subscription) to "([^"]*)"', re.IGNORECASE)
ERROR_CLASS = "ERROR_CLASS_WORKER_BUG"  # a deployment mismatch of ours or core's, never the job's input

Record = Callable[[str, str], None]  # (component, detail): workers.faults.record_fault, bound to a client
POOL_ROLE, BRIDGE_ROLE = "pool", "bridge"


def fault_component(role: str, worker_name: str) -> str:
    """The name a refusal's fault is recorded under (``workers.faults``): ``cairn-<role>/<worker_name>``."""
    return f"cairn-{role}/{worker_name}"


@dataclass(frozen=True)
class Refusal:
    """One refused operation: ``publish`` or ``subscription``, and the subject as we name it."""

    op: str
    subject: str

    def describe(self) -> str:
        return f'NATS refused {self.op} to "{self.subject}" (Permissions Violation)'


class PermissionRefused(PermanentJobError):
    """NATS refused a subject this pool needs: no retry can help until a permission changes."""

    code = "permission_refused"
    error_class = ERROR_CLASS

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(f"{refusal.describe()}: outside this pool's NATS permissions")
        self.refusal = refusal


def parse_refusal(exc: BaseException) -> Refusal | None:
    """The refusal an error-callback exception reports, or None for any other error."""
    match = _REFUSAL.search(str(exc))
    return Refusal(match[1].lower(), match[2]) if match else None


@dataclass
class _Waiter:
    subject: str | None  # None: any refusal
    claim: bool
    future: asyncio.Future[Refusal]


class Refusals:
    """The refusals of one NATS connection: reported once each, and raised to whoever awaits them.

    Under auth-callout a subject outside core's template is refused with ``Permissions
    Violation``; nats-py hands that to the error callback (:meth:`note`) and the request simply
    times out. Read as a timeout it would be NAKed and refused again for ever, so each refused
    subject is logged once at ERROR and recorded as a standing fault (``workers.faults``), and
    :meth:`guard` raises :class:`PermissionRefused` at once. :meth:`clear` forgets them on
    reconnect, whose new JWT may carry the missing permission.
    """

    def __init__(self, component: str, record: Record | None = None) -> None:
        self.component = component  # the fault's name in ``workers.faults`` (e.g. ``cairn-pool/<worker_name>``)
        self._record = record
        self._seen: dict[str, Refusal] = {}
        self._waiters: list[_Waiter] = []

    def note(self, exc: BaseException) -> bool:
        """Called first by the connection's error callback; True when ``exc`` was a refusal (handled)."""
        reported = parse_refusal(exc)
        if reported is None:
            return False
        key = reported.subject.lower()
        waiting = [w for w in self._waiters if not w.future.done()
                   and (w.subject is None or w.subject.lower() == key)]
        # nats-py lower-cases the report; a waiter that named the subject knows how we spell it
        spelled = next((w.subject for w in waiting if w.subject is not None), reported.subject)
        refusal = Refusal(reported.op, spelled)
        for waiter in waiting:
            waiter.future.set_result(refusal)
        claimed = any(w.claim for w in waiting)
        if key not in self._seen:
            self._seen[key] = refusal
            if not claimed:
                log.error("%s: outside this pool's NATS permissions (core's worker template, contract §1); "
                          "what needs it fails for good until the permission or CAIRN_PROVIDER/"
                          "CAIRN_WORKER_NAME is fixed", refusal.describe())
            self._store(refusal)
        return True

    def refused(self, subject: str) -> Refusal | None:
        """The refusal of ``subject`` seen on this connection, if any."""
        return self._seen.get(subject.lower())

    def clear(self) -> None:
        """A reconnect: the new connection's permissions may differ; refusals are learned again."""
        self._seen.clear()

    async def guard(self, operation: Awaitable[T], subject: str | None = None, *, claim: bool = False) -> T:
        """Await ``operation``; :class:`PermissionRefused` as soon as NATS refuses ``subject`` (any
        subject when None) meanwhile. ``claim``: the caller reports the refusal, ``note`` does not log it."""
        waiter = _Waiter(subject, claim, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        task = asyncio.ensure_future(operation)
        try:
            racing: list[asyncio.Future[Any]] = [task, waiter.future]
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waiters.remove(waiter)
        if waiter.future.done():  # checked first: a refused publish's flush completes right after
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise PermissionRefused(waiter.future.result())
        waiter.future.cancel()
        return task.result()

    def _store(self, refusal: Refusal) -> None:
        """Record the fault off the event loop (a Redis round trip must not stall NATS)."""
        if self._record is None:
            return
        detail = f"{refusal.describe()}: outside this pool's NATS permissions"
        try:
            loop: Any = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            self._record(self.component, detail)
        else:
            loop.run_in_executor(None, self._record, self.component, detail)


async def guarded(nats: Any, operation: Awaitable[T], subject: str) -> T:
    """``operation`` through the connection's refusals when it has them (``NatsThread``, the bridge's
    ``LoopNats``); a bare connection object in a unit test just awaits it."""
    refusals = getattr(nats, "refusals", None)
    if isinstance(refusals, Refusals):
        return await refusals.guard(operation, subject)
    return await operation
