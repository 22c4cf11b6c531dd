"""P1 in process: Garmin logins are single-flight per account, on a host's threads and across hosts.

The Garmin pool runs its jobs on threads (the Procfile's ``garmin`` line), so one
``GarminSessions`` serves every job of a host. Against the fake Garmin Connect, with
garth's real requests: a burst of one account's jobs on many threads logs in once; two
hosts sharing Redis log in once each, never at the same moment, and the lock they share
holds no secret; an expired OAuth2 token is refreshed once for the whole burst; a
re-connect with a new password drops the cached session even while Garmin still accepts
it; the LRU bound and the idle TTL apply to the shared session; no call borrows garth's
shared default headers (another account's bearer would ride on them).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import redis

from devstack.fakes.garmin import FakeGarmin
from workers.providers.context import Login, ProviderContext
from workers.providers.garmin.login_gate import LOCK_PREFIX, LoginGate
from workers.providers.garmin.provider import GarminProvider
from workers.providers.garmin.session import Client
from workers.providers.garmin.settings import GarminSettings

EMAIL, PASSWORD = "burst@example.com", "correct-horse-battery"
OTHER_EMAIL = "other@example.com"
THREADS = 8
ACTIVITIES = 8


@pytest.fixture
def garmin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeGarmin]:
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GARTH_HOME", "GARTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with FakeGarmin() as fake:
        fake.add_account(EMAIL, PASSWORD, n_activities=ACTIVITIES)
        fake.add_account(OTHER_EMAIL, PASSWORD, n_activities=1)
        yield fake


@pytest.fixture
def host(garmin: FakeGarmin, fresh_redis: str) -> Iterator[Callable[..., GarminProvider]]:
    """A Garmin provider as one host of the pool runs it: its own sessions, the fleet's Redis for the gate."""
    clients: list[redis.Redis] = []

    def make(**settings: Any) -> GarminProvider:
        env = garmin.pool_env
        client = redis.Redis.from_url(fresh_redis)
        clients.append(client)
        return GarminProvider(GarminSettings(domain=env["CAIRN_GARMIN_DOMAIN"], proxy_url=env["CAIRN_GARMIN_PROXY_URL"],
                                             ca_bundle=env["CAIRN_GARMIN_CA_BUNDLE"], **settings),
                              gate=LoginGate(client))

    yield make
    for client in clients:
        client.close()


def ctx(password: str = PASSWORD, account_id: str = "acct-1", email: str = EMAIL) -> ProviderContext:
    return ProviderContext(access_token="", http=httpx.Client(), login=Login(email, password),
                           account_id=account_id)  # no shared budget: these tests count logins, not windows


def job(ext_id: int | str, account_id: str = "acct-1") -> SimpleNamespace:
    return SimpleNamespace(user_id="u-1", account_id=account_id, ext_id=str(ext_id), fetch_streams=True)


def _burst(providers: list[GarminProvider], ids: list[int], password: str = PASSWORD) -> None:
    """Every activity on ``THREADS`` threads per provider, all started together."""
    start = threading.Barrier(THREADS * len(providers))

    def run(provider: GarminProvider, ext_id: int) -> None:
        start.wait()
        provider.fetch_source(ctx(password), job(ext_id))

    with ThreadPoolExecutor(THREADS * len(providers)) as pool:
        futures = [pool.submit(run, p, ids[n % len(ids)]) for p in providers for n in range(THREADS)]
        for future in futures:
            future.result()


def test_a_burst_on_one_hosts_threads_logs_in_once(garmin: FakeGarmin, host: Callable[..., GarminProvider]) -> None:
    provider = host()
    _burst([provider], [a.activity_id for a in garmin.account(EMAIL).newest_first()])
    assert garmin.logins(EMAIL) == 1 and provider.sessions.logins == 1
    assert garmin.calls("exchange", EMAIL) == 1  # one OAuth2 token for the whole burst


def test_two_hosts_log_in_once_each_one_after_the_other_and_the_lock_holds_no_secret(
        garmin: FakeGarmin, host: Callable[..., GarminProvider], fresh_redis: str) -> None:
    first, second = host(), host()
    seen: list[bytes | str | None] = []  # redis-py's get(): str only with decode_responses
    client = redis.Redis.from_url(fresh_redis)
    real_login = first.sessions._login

    def observed_login(ctx: ProviderContext, login: Login) -> Client:  # _login's parameter names
        seen.append(client.get(LOCK_PREFIX + ctx.account_id))  # the key while this host logs in
        return real_login(ctx, login)

    first.sessions._login = observed_login  # type: ignore[method-assign]
    _burst([first, second], [a.activity_id for a in garmin.account(EMAIL).newest_first()])
    assert garmin.logins(EMAIL) == 2 and first.sessions.logins == second.sessions.logins == 1
    assert len(seen) == 1 and seen[0] is not None  # the first host logged in holding the account's key
    assert isinstance(seen[0], bytes)
    value = seen[0].decode()
    assert len(value) == 32 and EMAIL not in value and PASSWORD not in value  # a random token, no secret
    assert client.get(LOCK_PREFIX + "acct-1") is None  # released after the login
    client.close()


def test_an_expired_oauth2_token_is_refreshed_once_for_the_whole_burst(
        garmin: FakeGarmin, host: Callable[..., GarminProvider]) -> None:
    provider = host()
    ids = [a.activity_id for a in garmin.account(EMAIL).newest_first()]
    provider.fetch_source(ctx(), job(ids[0]))
    session = provider.sessions._sessions["acct-1"]
    token = session.client.oauth2_token
    assert token is not None and not isinstance(token, dict)  # garth's OAuth2Token after a login
    token.expires_at = 0  # the bearer has expired: garth refreshes it on the next call
    exchanges = garmin.calls("exchange", EMAIL)
    _burst([provider], ids)
    assert garmin.calls("exchange", EMAIL) == exchanges + 1 and garmin.logins(EMAIL) == 1


def test_a_reconnect_with_a_new_password_drops_the_cached_session(garmin: FakeGarmin,
                                                                    host: Callable[..., GarminProvider]) -> None:
    provider = host()
    ids = [a.activity_id for a in garmin.account(EMAIL).newest_first()]
    provider.fetch_source(ctx(), job(ids[0]))
    old = provider.sessions._sessions["acct-1"]
    garmin.account(EMAIL).password = "a-new-password-1"  # changed at Garmin; the old session still works there
    _burst([provider], ids, password="a-new-password-1")
    assert garmin.logins(EMAIL) == 2  # the re-connect's login, once for the burst
    assert provider.sessions._sessions["acct-1"] is not old


def test_the_lru_bound_and_the_idle_ttl_apply_to_the_shared_session(
        garmin: FakeGarmin, host: Callable[..., GarminProvider]) -> None:
    provider = host(session_cache_max=1)
    mine = garmin.account(EMAIL).newest_first()[0].activity_id
    other = garmin.account(OTHER_EMAIL).newest_first()[0].activity_id
    provider.fetch_source(ctx(), job(mine))
    provider.fetch_source(ctx(account_id="acct-2", email=OTHER_EMAIL), job(other, "acct-2"))
    assert not provider.sessions.cached("acct-1") and provider.sessions.cached("acct-2")  # the LRU evicted it
    provider.fetch_source(ctx(), job(mine))
    assert garmin.logins(EMAIL) == 2
    idle = host(session_idle_ttl_s=1e-9)  # every session is idle by the next call
    idle.list_activities(ctx(), None)
    idle.list_activities(ctx(), None)
    assert garmin.logins(EMAIL) == 4


def test_no_call_uses_garths_shared_default_headers(garmin: FakeGarmin, host: Callable[..., GarminProvider]) -> None:
    """garth writes the bearer into ``request``'s mutable default ``headers``; shared by every thread of the
    process, it would carry one account's bearer into another's call."""
    shared = inspect.signature(Client.request).parameters["headers"].default
    assert isinstance(shared, dict)
    shared.clear()
    provider = host()
    provider.fetch_source(ctx(), job(garmin.account(EMAIL).newest_first()[0].activity_id))
    provider.list_activities(ctx(), None)
    assert shared == {}
