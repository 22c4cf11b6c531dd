"""The shared provider budget in the ``cairn_rate_limits`` KV, per provider app."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import nats.errors
from google.protobuf import json_format
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError

from workers.cairn.contract import subjects
from workers.cairn.contract.pb.cairn.worker.v1 import worker_pb2 as pb
from workers.cairn.disposition import MIN_NAK_DELAY_S
from workers.cairn.refusals import PermissionRefused
from workers.providers.errors import ProviderRateLimited, ProviderTransientError
from workers.providers.windows import RateWindow, WindowUsage

CAS_ATTEMPTS = 200
CAS_BACKOFF_BASE_S = 0.0002  # jittered backoff after a lost CAS round: base × 2^attempt, capped
CAS_BACKOFF_MAX_S = 0.02
CAS_GIVE_UP_RETRY_S = 0.06  # after CAS_ATTEMPTS lost rounds: a soft deny with a ~60 ms retry
KV_TIMEOUT_S = 5.0
UNDECLARED_WINDOW_LENGTH_S = 15 * 60  # a window the provider reports but never declared
CAS_CONFLICT_ERR_CODES = (10071, 10164)  # JetStream "wrong last sequence" as a BadRequestError


def nak_delay_s(reset_at: datetime, now: datetime | None = None) -> float:
    """The NAK delay anchored to the real window reset (contract §3), never below one second."""
    now = now or datetime.now(UTC)
    return max(MIN_NAK_DELAY_S, (reset_at - now).total_seconds())


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _parse(t: str | None) -> datetime | None:
    if not t:
        return None
    try:
        return datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        return None


class BudgetUnavailable(ProviderTransientError):
    """The shared budget cannot be read (core has not created the bucket yet, NATS is down).

    Transient: the job is NAKed and retried; an API call never goes out unbudgeted.
    """

    code = "rate_limit_unavailable"


@dataclass
class WindowState:
    capacity: int = 0
    used: int = 0
    window_start: datetime | None = None
    window_reset_at: datetime | None = None

    @classmethod
    def decode(cls, raw: bytes | None) -> WindowState:
        try:
            d = json.loads(raw or b"{}")
            return cls(int(d.get("capacity", 0)), int(d.get("used", 0)), _parse(d.get("window_start")),
                       _parse(d.get("window_reset_at")))
        except (ValueError, TypeError, AttributeError):
            return cls()

    def same_budget(self, other: WindowState | None) -> bool:
        """Same capacity, use and reset: storing one over the other would change nothing a reader acts on."""
        return (other is not None and self.capacity == other.capacity and self.used == other.used
                and self.window_reset_at == other.window_reset_at)

    def encode(self) -> bytes:
        return json.dumps({"capacity": self.capacity, "used": self.used,
                           "window_start": _iso(self.window_start or datetime.now(UTC)),
                           "window_reset_at": _iso(self.window_reset_at or datetime.now(UTC))}).encode()


class RateLimiter:
    """KV-backed limiter; ``hook(app_id)`` gives the provider a ``RateLimitHook`` for one job.

    Keys are ``<provider>.<app_id>.<window>`` (contract §3; without ``app_id`` the pool's name):
    per provider app, not per pool, because the provider enforces an app's budget whichever
    pool spends it. Values are the Strava worker's limiter JSON (reference §3.8). ``reserve`` is
    a compare-and-set loop so any number of processes share one budget without overspending.
    Windows and fallback capacities are the provider's (``Provider.rate_windows()``); one it
    did not declare is unlimited until it reports a limit.
    """

    def __init__(self, nats_thread: Any, settings: Any, windows: Sequence[RateWindow] = ()) -> None:
        self._nats = nats_thread
        self.provider = str(settings.provider)
        self.pool = str(settings.worker_name)
        self.windows = {w.name: w for w in windows}
        self._kv: Any = None
        # What this process last stored under each key (a reservation or a sync): a reported usage
        # equal to it is not stored again (``sync``). Bounded by the pool's apps × windows.
        self._stored: dict[str, WindowState] = {}

    def _bucket(self) -> Any:
        """The KV bucket, opened on first use from the calling thread (never from the loop thread)."""
        if self._kv is None:
            try:
                self._kv = self._nats.run(self._nats.js.key_value(subjects.RATE_LIMIT_BUCKET), KV_TIMEOUT_S)
            except PermissionRefused:
                raise  # permanent (workers.cairn.refusals): not "try again later"
            except Exception as exc:  # noqa: BLE001 - no bucket yet (core not up), timeout, disconnected
                raise BudgetUnavailable(f"{subjects.RATE_LIMIT_BUCKET} KV: {type(exc).__name__}") from None
        return self._kv

    def key(self, app_id: str | None, window: str) -> str:
        return subjects.rate_limit_key(self.provider, app_id or self.pool, window)

    async def _read(self, kv: Any, key: str) -> tuple[WindowState, int]:
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            return WindowState(), 0
        return WindowState.decode(entry.value), entry.revision

    def _get(self, key: str) -> tuple[WindowState, int]:
        kv = self._bucket()  # outside the coroutine: opening it blocks on the loop thread
        return self._kv_call(self._read(kv, key), KV_TIMEOUT_S)

    async def _reserve_one(self, kv: Any, key: str, window: str, n: int) -> None:
        """The CAS loop of one window, on the NATS loop thread (reference §3.8)."""
        spec = self.windows.get(window)
        for attempt in range(CAS_ATTEMPTS):
            state, revision = await self._read(kv, key)
            now = datetime.now(UTC)
            if state.window_reset_at is None or now >= state.window_reset_at:
                length = spec.length_s if spec else UNDECLARED_WINDOW_LENGTH_S
                state = WindowState(state.capacity or (spec.capacity if spec else 0), 0, now,
                                    now + timedelta(seconds=length))
            if state.capacity <= 0:
                return  # unknown window: unlimited
            if state.used + n > state.capacity:
                raise ProviderRateLimited(state.window_reset_at, window)  # type: ignore[arg-type]
            state.used += n
            try:
                if revision == 0:
                    await kv.create(key, state.encode())
                else:
                    await kv.update(key, state.encode(), last=revision)
                self._stored[key] = state
                return
            except (KeyWrongLastSequenceError, Exception) as exc:  # lost the CAS race
                if not _is_cas_conflict(exc, KeyWrongLastSequenceError):
                    raise
                await asyncio.sleep(random.uniform(0, min(CAS_BACKOFF_BASE_S * 2 ** min(attempt, 6),
                                                          CAS_BACKOFF_MAX_S)))
        raise ProviderRateLimited(datetime.now(UTC) + timedelta(seconds=CAS_GIVE_UP_RETRY_S), window)

    def reserve(self, app_id: str | None, window: str, n: int = 1) -> None:
        """Spend ``n`` from ``window`` or raise ``ProviderRateLimited`` anchored to its reset."""
        self.reserve_all(app_id, (window,), n)

    def reserve_all(self, app_id: str | None, windows: Sequence[str], n: int = 1) -> None:
        """Spend ``n`` from each window in order (daily first, then short: a daily token spent
        before a short-window deny is not returned, as in the published worker).

        One hand-off to the NATS loop for the whole reservation, not one per KV call:
        every API call reserves before it goes out, so this is on the hot path.
        """
        kv = self._bucket()

        async def reserve() -> None:
            for window in windows:
                await self._reserve_one(kv, self.key(app_id, window), window, n)

        self._kv_call(reserve(), KV_TIMEOUT_S * len(windows))

    def sync(self, app_id: str | None, usage: Sequence[WindowUsage]) -> None:
        """Store what the provider reported (its numbers are the truth), unless it is exactly what
        this process last stored under that key.

        Why the exception: every call first reserves (the budget's ``used`` goes up by one) and the
        provider then reports its own count, which is that same number whenever no other call of
        the app slipped in between; storing it again would be two KV writes per API call that
        change nothing. Whenever the report differs (another process spent meanwhile, the
        provider counted calls we did not, a window rolled over), it is stored as before. A skipped
        report never lowers the budget below what other processes reserved since. The windows'
        puts go out together in one hand-off to the NATS loop.
        """
        states = {self.key(app_id, w.window): WindowState(w.limit, w.used, datetime.now(UTC), w.reset_at)
                  for w in usage if w.limit > 0}
        changed = {key: state for key, state in states.items() if not state.same_budget(self._stored.get(key))}
        if not changed:
            return
        kv = self._bucket()

        async def put_all() -> None:
            await asyncio.gather(*(kv.put(key, state.encode()) for key, state in changed.items()))

        self._kv_call(put_all(), KV_TIMEOUT_S)
        self._stored.update(changed)

    def _kv_call(self, call: Coroutine[Any, Any, Any], timeout_s: float) -> Any:
        """Run one KV hand-off; no answer from NATS (a timeout: a partition, a frozen server) is the
        budget being unavailable, a transient NAK, never an "unexpected" failure counted toward the
        job's termination (found by bench partitions: provider host DROPped from NATS)."""
        try:
            return self._nats.run(call, timeout_s)
        except (TimeoutError, nats.errors.Error) as exc:
            raise BudgetUnavailable(f"{subjects.RATE_LIMIT_BUCKET} KV: {type(exc).__name__}") from None

    def snapshot(self, app_id: str | None) -> dict[str, Any]:
        """A RateLimitSnapshot (protojson dict) of the windows the provider places in one
        (``RateWindow.snapshot_as``: Strava's 15-minute window is ``short``, its daily ``long``)."""
        body: dict[str, Any] = {}
        for spec in self.windows.values():
            if spec.snapshot_as is None:
                continue
            state, _ = self._get(self.key(app_id, spec.name))
            body[f"{spec.snapshot_as}Remaining"] = max(0, state.capacity - state.used)
            body[f"{spec.snapshot_as}Limit"] = state.capacity
            if state.window_reset_at:
                body[f"{spec.snapshot_as}ResetAt"] = _iso(state.window_reset_at)
        return body

    def snapshot_pb(self, app_id: str | None) -> Any:
        """The same snapshot as a ``cairn.worker.v1.RateLimitSnapshot`` message."""
        return json_format.ParseDict(self.snapshot(app_id), pb.RateLimitSnapshot())

    def hook(self, app_id: str | None) -> AppHook:
        return AppHook(self, app_id)


def _is_cas_conflict(exc: BaseException, cls: type) -> bool:
    if isinstance(exc, cls):
        return True
    return isinstance(exc, BadRequestError) and getattr(exc, "err_code", None) in CAS_CONFLICT_ERR_CODES


@dataclass
class AppHook:
    """The provider-facing ``RateLimitHook`` for one app id."""

    limiter: RateLimiter
    app_id: str | None

    def reserve(self, windows: Sequence[str]) -> None:
        self.limiter.reserve_all(self.app_id, windows)  # daily first, then short (reference §3.8)

    def observe(self, usage: Sequence[WindowUsage], headers: Mapping[str, str]) -> None:
        self.limiter.sync(self.app_id, usage)
