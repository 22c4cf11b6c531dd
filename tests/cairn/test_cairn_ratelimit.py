"""Shared rate limiter over the real ``cairn_rate_limits`` KV (nats-server with JetStream)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devstack.fakes.strava import FakeStrava
from devstack.infra import services
from devstack.infra.procs import frozen
from tests.kit.cairn_ctx import core_bucket
from workers.cairn import ratelimit
from workers.cairn.contract import subjects
from workers.cairn.contract.jobs import FetchSourceJob
from workers.cairn.contract.pb.cairn.worker.v1 import worker_pb2 as pb
from workers.cairn.handlers.context import JobContext
from workers.cairn.handlers.fetch_source import build_provider_context
from workers.cairn.nats_conn import NatsThread
from workers.cairn.ratelimit import BudgetUnavailable, RateLimiter, WindowState, nak_delay_s
from workers.cairn.settings import CairnSettings
from workers.providers.errors import ProviderRateLimited
from workers.providers.models import PoolIdentity
from workers.providers.strava.provider import StravaProvider
from workers.providers.strava.settings import StravaSettings
from workers.providers.strava.usage import RATE_WINDOWS, RESET_GRACE_S, next_daily_reset, next_short_reset
from workers.providers.windows import RateWindow, WindowUsage

POOL = "strava-fetcher"
NO_ANSWER_BOUND_S = 1.0  # how long a KV call waits for a frozen nats-server in the test that freezes one


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    with services.nats_server() as svc:
        admin = NatsThread(CairnSettings(nats_url=svc.url, worker_name="cairn-core"))
        js = admin.js
        admin.run(core_bucket(js, subjects.RATE_LIMIT_BUCKET), 10)
        admin.close()
        yield svc.url


@pytest.fixture()
def limiter(nats_url: str) -> Iterator[RateLimiter]:
    thread = NatsThread(CairnSettings(nats_url=nats_url, worker_name=POOL))
    yield RateLimiter(thread, CairnSettings(nats_url=nats_url, worker_name=POOL), RATE_WINDOWS)  # Strava's
    thread.close()


def app() -> str:
    return uuid.uuid4().hex[:12]  # a fresh provider app per test: tests never share a budget


def stored(limiter: RateLimiter, key: str) -> dict[str, Any]:
    kv = limiter._bucket()
    return json.loads(limiter._nats.run(kv.get(key), 5).value)


def test_reserve_spends_until_capacity_then_denies_at_the_reset(limiter: RateLimiter) -> None:
    app_id = app()
    reset = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=7)
    limiter.sync(app_id, [WindowUsage("short", limit=3, used=1, reset_at=reset)])
    limiter.reserve(app_id, "short")
    limiter.reserve(app_id, "short")
    with pytest.raises(ProviderRateLimited) as denied:
        limiter.reserve(app_id, "short")
    assert denied.value.window == "short" and denied.value.reset_at == reset
    assert 6 * 60 < denied.value.delay_s() <= 7 * 60
    state = stored(limiter, f"strava.{app_id}.short")
    assert state["capacity"] == 3 and state["used"] == 3
    assert state["window_reset_at"].endswith("Z")


def test_key_layout_with_and_without_app_id(limiter: RateLimiter) -> None:
    assert limiter.key("abc", "daily") == "strava.abc.daily"
    assert limiter.key(None, "daily") == f"strava.{POOL}.daily"  # older core: the pool's bucket


def test_first_reserve_opens_a_window_at_the_fallback_capacity(limiter: RateLimiter) -> None:
    app_id = app()
    before = datetime.now(UTC)
    limiter.hook(app_id).reserve(["daily", "short"])  # daily first, then short (reference §3.8)
    daily = WindowState.decode(json.dumps(stored(limiter, f"strava.{app_id}.daily")).encode())
    assert (daily.capacity, daily.used) == (1000, 1)
    assert daily.window_reset_at is not None
    assert timedelta(hours=23, minutes=59) < daily.window_reset_at - before <= timedelta(hours=24, seconds=5)
    assert stored(limiter, f"strava.{app_id}.short")["used"] == 1


def test_an_elapsed_window_restarts_with_the_known_capacity(limiter: RateLimiter) -> None:
    app_id = app()
    past = datetime.now(UTC) - timedelta(seconds=1)
    limiter.sync(app_id, [WindowUsage("short", limit=7, used=7, reset_at=past)])
    limiter.reserve(app_id, "short")  # would be denied if the old window still counted
    state = stored(limiter, f"strava.{app_id}.short")
    assert (state["capacity"], state["used"]) == (7, 1)


def test_two_reservers_never_exceed_the_budget(nats_url: str) -> None:
    """Two connections (two worker processes) race on one key; CAS lets exactly ``capacity`` through."""
    app_id, capacity = app(), 40
    settings = CairnSettings(nats_url=nats_url, worker_name=POOL)
    threads = [NatsThread(settings), NatsThread(settings)]
    limiters = [RateLimiter(t, settings, RATE_WINDOWS) for t in threads]
    reset = datetime.now(UTC) + timedelta(minutes=10)
    limiters[0].sync(app_id, [WindowUsage("short", limit=capacity, used=0, reset_at=reset)])
    for lim in limiters:
        lim._bucket()  # open the bucket from this thread (never from the loop thread)
    granted = [0, 0]
    start = threading.Barrier(2)

    def run(i: int) -> None:
        start.wait()
        while True:
            try:
                limiters[i].reserve(app_id, "short")
            except ProviderRateLimited:
                return
            granted[i] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    try:
        assert sum(granted) == capacity, granted
        assert min(granted) > 0, f"no contention exercised: {granted}"
        assert stored(limiters[0], f"strava.{app_id}.short")["used"] == capacity
    finally:
        for t in threads:
            t.close()


def revision(limiter: RateLimiter, key: str) -> int:
    return int(limiter._nats.run(limiter._bucket().get(key), 5).revision)


def test_a_report_equal_to_what_this_process_stored_is_not_stored_again(limiter: RateLimiter,
                                                                        nats_url: str) -> None:
    """Every call reserves (used + 1) and the provider then reports that same count: storing it
    again changed nothing and cost two KV writes per API call (issue 15 §3)."""
    app_id = app()
    key = f"strava.{app_id}.short"
    reset = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=9)
    limiter.sync(app_id, [WindowUsage("short", limit=100, used=4, reset_at=reset)])  # first report: stored
    limiter.reserve(app_id, "short")  # used 5
    written = revision(limiter, key)
    limiter.sync(app_id, [WindowUsage("short", limit=100, used=5, reset_at=reset)])  # the call we reserved
    assert revision(limiter, key) == written
    assert stored(limiter, key)["used"] == 5

    other_thread = NatsThread(CairnSettings(nats_url=nats_url, worker_name=POOL))  # another worker process
    other = RateLimiter(other_thread, CairnSettings(nats_url=nats_url, worker_name=POOL), RATE_WINDOWS)
    try:
        other.reserve(app_id, "short")  # used 6: its call is on the way
        limiter.sync(app_id, [WindowUsage("short", limit=100, used=5, reset_at=reset)])  # ours alone counted yet
        assert stored(limiter, key)["used"] == 6  # not lowered below what the other process reserved
        limiter.sync(app_id, [WindowUsage("short", limit=100, used=7, reset_at=reset)])  # differs: the truth
        assert stored(limiter, key)["used"] == 7
        later = reset + timedelta(minutes=15)  # the window rolled over: a new reset is stored
        limiter.sync(app_id, [WindowUsage("short", limit=100, used=7, reset_at=later)])
        assert stored(limiter, key)["window_reset_at"].startswith(later.strftime("%Y-%m-%dT%H:%M"))
    finally:
        other_thread.close()


def test_snapshot_is_a_rate_limit_snapshot(limiter: RateLimiter) -> None:
    app_id = app()
    now = datetime.now(UTC).replace(microsecond=0)
    limiter.sync(app_id, [WindowUsage("short", limit=100, used=87, reset_at=now + timedelta(minutes=3)),
                          WindowUsage("daily", limit=1000, used=900, reset_at=now + timedelta(hours=5)),
                          WindowUsage("webhook", limit=0, used=0, reset_at=now)])  # limit <= 0: skipped
    snap = limiter.snapshot_pb(app_id)
    assert isinstance(snap, pb.RateLimitSnapshot)
    assert (snap.short_remaining, snap.short_limit, snap.long_remaining, snap.long_limit) == (13, 100, 100, 1000)
    assert snap.short_reset_at.ToDatetime(tzinfo=UTC) == now + timedelta(minutes=3)
    with pytest.raises(Exception):  # noqa: B017 - KeyNotFoundError: the skipped window was never written
        stored(limiter, f"strava.{app_id}.webhook")


def test_reset_helpers_anchor_to_real_windows() -> None:
    """Strava's windows reset on the clock (its provider computes them); the NAK waits for the reset."""
    now = datetime(2026, 7, 20, 12, 7, 30, tzinfo=UTC)
    grace = timedelta(seconds=RESET_GRACE_S)
    assert next_short_reset(now) + grace == datetime(2026, 7, 20, 12, 15, 5, tzinfo=UTC)
    assert next_short_reset(now) == datetime(2026, 7, 20, 12, 15, tzinfo=UTC)
    assert next_daily_reset(now) + grace == datetime(2026, 7, 21, 0, 0, 5, tzinfo=UTC)
    assert nak_delay_s(now + timedelta(seconds=90), now) == 90.0
    assert nak_delay_s(now - timedelta(seconds=5), now) == 1.0  # never a hot loop


def test_windows_are_the_providers_declaration(nats_url: str) -> None:
    """The limiter knows only what the provider declares: another provider's windows, capacities
    and lengths, under its own keys; an undeclared window is unlimited; the snapshot slots follow
    ``snapshot_as``."""
    settings = CairnSettings(nats_url=nats_url, provider="garmin", worker_name="garmin-pool")
    windows = (RateWindow("minute", 2, 60, snapshot_as="short"), RateWindow("hour", 50, 3600, snapshot_as="long"))
    thread = NatsThread(settings)
    try:
        limiter = RateLimiter(thread, settings, windows)
        app_id, before = app(), datetime.now(UTC)
        hook = limiter.hook(app_id)
        hook.reserve(["hour", "minute"])
        hook.reserve(["hour", "minute"])
        with pytest.raises(ProviderRateLimited) as denied:
            hook.reserve(["hour", "minute"])
        assert denied.value.window == "minute"
        assert 55 < (denied.value.reset_at - before).total_seconds() <= 61
        minute = stored(limiter, f"garmin.{app_id}.minute")
        assert (minute["capacity"], minute["used"]) == (2, 2)
        assert stored(limiter, f"garmin.{app_id}.hour")["capacity"] == 50
        for _ in range(5):
            hook.reserve(["daily"])  # not declared: never denied, never written
        with pytest.raises(Exception):  # noqa: B017 - KeyNotFoundError
            stored(limiter, f"garmin.{app_id}.daily")
        snap = limiter.snapshot(app_id)
        assert (snap["shortLimit"], snap["shortRemaining"], snap["longLimit"]) == (2, 0, 50)
    finally:
        thread.close()


def test_the_provider_picks_the_window_a_job_spends(limiter: RateLimiter) -> None:
    """The short-term window is the provider's decision from the job's reason: a Strava webhook
    fetch spends ``webhook`` (and ``daily``), any other fetch ``short``; the handler only asks."""
    athlete = 8800
    with FakeStrava() as strava:
        strava.add_athlete(athlete, n_activities=1, with_gear=False)
        ext_id = str(next(iter(strava.athlete(athlete).activities)))
        provider = StravaProvider(StravaSettings(base_url=strava.base_url), pool=PoolIdentity(POOL, "p"))
        with provider.new_http_client() as http:
            ctx = JobContext(settings=CairnSettings(worker_name=POOL), nats=None, redis=None, provider=provider,
                             http=http, limiter=limiter)
            for reason, bucket in (("webhook", "webhook"), ("backfill", "short")):
                app_id = app()
                job = FetchSourceJob(job_id="j", account_id="a", user_id="u", ext_id=ext_id, fetch_streams=False,
                                     reason=reason)
                pctx = build_provider_context(ctx, job, access_token=strava.athlete(athlete).access_token,
                                              app_id=app_id)
                assert pctx.bucket == bucket
                provider.fetch_source(pctx, job)
                # Strava reports short and daily usage (synced over our reservations), never webhook
                # usage: the webhook window holds exactly what webhook fetches reserved.
                if reason == "webhook":
                    assert stored(limiter, f"strava.{app_id}.webhook")["used"] == 1
                else:
                    with pytest.raises(Exception):  # noqa: B017 - KeyNotFoundError: never reserved
                        stored(limiter, f"strava.{app_id}.webhook")
                assert stored(limiter, f"strava.{app_id}.daily")["used"] >= 1


def test_no_bucket_is_a_transient_error_and_no_call_goes_unbudgeted() -> None:
    """Core has not created cairn_rate_limits yet: reserving fails (NAK and retry), it is never skipped."""
    with services.nats_server() as svc:
        settings = CairnSettings(nats_url=svc.url, worker_name=POOL)
        thread = NatsThread(settings)
        try:
            with pytest.raises(BudgetUnavailable) as err:
                RateLimiter(thread, settings, RATE_WINDOWS).hook("app").reserve(["daily", "short"])
            assert err.value.retryable
        finally:
            thread.close()


def test_a_kv_call_nats_never_answers_is_a_transient_budget_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A NATS restart under an in-flight KV call (its reply never comes) is the budget being unavailable,
    a transient NAK like every NATS outage, not an ``unexpected failure TimeoutError`` (found by the chaos
    run's log budget). A frozen server is that, deterministically: the call is sent, no reply comes. The
    reads and the stored usage here; the reservation in tests/cairn/test_cairn_publish_retry.py."""
    with services.nats_server() as svc:  # a server of its own: this test freezes it
        admin = NatsThread(CairnSettings(nats_url=svc.url, worker_name="cairn-core"))
        admin.run(core_bucket(admin.js, subjects.RATE_LIMIT_BUCKET), 10)
        admin.close()
        settings = CairnSettings(nats_url=svc.url, worker_name=POOL)
        thread = NatsThread(settings)
        limiter = RateLimiter(thread, settings, RATE_WINDOWS)
        app_id = app()
        hook = limiter.hook(app_id)
        hook.reserve(["daily", "short"])  # connected, bucket open
        monkeypatch.setattr(ratelimit, "KV_TIMEOUT_S", NO_ANSWER_BOUND_S)  # the wait, not what it proves
        assert svc.proc is not None
        try:
            with frozen(svc.proc.pid):
                usage = [WindowUsage("short", limit=100, used=1, reset_at=datetime.now(UTC) + timedelta(minutes=5))]
                for call in (lambda: limiter.snapshot(app_id), lambda: hook.observe(usage, {})):
                    with pytest.raises(BudgetUnavailable, match="TimeoutError") as err:
                        call()
                    assert err.value.retryable
        finally:
            thread.close()
