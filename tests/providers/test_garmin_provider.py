"""The Garmin provider against the fake Garmin Connect, in process: garth's real requests, our session rules.

What must hold: one SSO login per account while its session lives (in memory,
nothing on disk), a new login when core hands out another password or Garmin
rejects the session, Garmin's login answers classified (wrong password →
needs-reauth, MFA and locked → blocked), 429 anchored to ``Retry-After`` and
written to the shared window, a 5xx one request and no hidden retry, and a
start refused when the environment would persist sessions or override the CA.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from devstack.fakes.garmin import FakeGarmin
from workers.errors import ConfigError
from workers.providers.context import Login, ProviderContext
from workers.providers.errors import (
    ProviderAccountBlocked,
    ProviderAuthError,
    ProviderNotFound,
    ProviderRateLimited,
    ProviderTransientError,
)
from workers.providers.garmin.provider import GarminProvider
from workers.providers.garmin.settings import GarminSettings, check_environment
from workers.providers.windows import WindowUsage

EMAIL, PASSWORD = "rider@example.com", "correct-horse-battery"


class Budget:
    """A RateLimitHook that records what the provider reserved and observed."""

    def __init__(self) -> None:
        self.reserved: list[tuple[str, ...]] = []
        self.observed: list[WindowUsage] = []

    def reserve(self, windows: Sequence[str]) -> None:
        self.reserved.append(tuple(windows))

    def observe(self, usage: Sequence[WindowUsage], headers: Mapping[str, str]) -> None:
        self.observed.extend(usage)


@pytest.fixture
def garmin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeGarmin]:
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GARTH_HOME", "GARTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # garth must write nothing there
    with FakeGarmin() as fake:
        fake.add_account(EMAIL, PASSWORD, n_activities=2)
        yield fake


@pytest.fixture
def provider(garmin: FakeGarmin) -> GarminProvider:
    env = garmin.pool_env
    return GarminProvider(GarminSettings(domain=env["CAIRN_GARMIN_DOMAIN"], proxy_url=env["CAIRN_GARMIN_PROXY_URL"],
                                         ca_bundle=env["CAIRN_GARMIN_CA_BUNDLE"]))


def ctx(password: str = PASSWORD, account_id: str = "acct-1", budget: Budget | None = None) -> ProviderContext:
    return ProviderContext(access_token="", http=httpx.Client(), login=Login(EMAIL, password),
                           account_id=account_id, rate_limit=budget or Budget())


def job(ext_id: int | str) -> SimpleNamespace:
    return SimpleNamespace(user_id="u-1", account_id="acct-1", ext_id=str(ext_id), fetch_streams=True)


def test_one_login_per_account_session_and_a_new_one_for_a_new_password(garmin: FakeGarmin,
                                                                         provider: GarminProvider,
                                                                         tmp_path: Path) -> None:
    budget = Budget()
    ids = [a.activity_id for a in garmin.account(EMAIL).newest_first()]
    for ext_id in ids:
        provider.fetch_source(ctx(budget=budget), job(ext_id))
    assert garmin.logins(EMAIL) == 1 and provider.sessions.logins == 1
    assert budget.reserved.count(("login",)) == 1
    assert budget.reserved.count(("daily", "short")) == 6  # summary, gear, download per activity
    garmin.change_password(EMAIL, "a-new-password-1")  # the user re-connects with the new password
    provider.fetch_source(ctx(password="a-new-password-1"), job(ids[0]))
    assert garmin.logins(EMAIL) == 2
    assert not any(tmp_path.iterdir())  # nothing persisted under HOME (no garth token files)


def test_a_rejected_session_logs_in_once_more(garmin: FakeGarmin, provider: GarminProvider) -> None:
    provider.list_activities(ctx(), None)
    garmin.revoke_sessions(EMAIL)  # Connect now answers 401 to the cached bearer
    assert len(provider.list_activities(ctx(), None)) == 2
    assert garmin.logins(EMAIL) == 2


def test_a_wrong_password_is_auth_error_and_names_no_secret(garmin: FakeGarmin, provider: GarminProvider) -> None:
    with pytest.raises(ProviderAuthError) as err:
        provider.list_activities(ctx(password="wrong-password-123"), None)
    assert err.value.code == "needs_reauth" and "wrong-password" not in str(err.value) and EMAIL not in str(err.value)
    assert garmin.logins(EMAIL) == 1 and not provider.sessions.cached("acct-1")


@pytest.mark.parametrize(("flag", "code"), [("mfa", "mfa_required"), ("locked", "account_locked")])
def test_mfa_and_locked_accounts_are_blocked(garmin: FakeGarmin, provider: GarminProvider, flag: str,
                                             code: str) -> None:
    setattr(garmin.account(EMAIL), flag, True)
    with pytest.raises(ProviderAccountBlocked) as err:
        provider.list_activities(ctx(), None)
    assert err.value.code == code and err.value.error_class == "ERROR_CLASS_AUTH_INVALID"


def test_429_is_anchored_to_retry_after_and_spends_the_shared_window(garmin: FakeGarmin,
                                                                     provider: GarminProvider) -> None:
    budget = Budget()
    garmin.fail("list", 429, retry_after_s=120)
    with pytest.raises(ProviderRateLimited) as err:
        provider.list_activities(ctx(budget=budget), None)
    assert err.value.window == "short" and 110 < err.value.delay_s() <= 121
    (usage,) = budget.observed
    assert (usage.window, usage.used, usage.limit) == ("short", 30, 30)  # every instance waits too
    garmin.fail("login", 429)
    with pytest.raises(ProviderRateLimited) as err:
        provider.list_activities(ctx(account_id="acct-2"), None)
    assert err.value.window == "login" and err.value.reset_at > datetime.now(UTC) + timedelta(minutes=50)


def test_a_5xx_is_transient_and_is_not_retried_inside_the_library(garmin: FakeGarmin,
                                                                   provider: GarminProvider) -> None:
    provider.list_activities(ctx(), None)
    ext_id = garmin.account(EMAIL).newest_first()[0].activity_id
    garmin.fail("activity", 503)
    with pytest.raises(ProviderTransientError):
        provider.fetch_source(ctx(), job(ext_id))
    assert garmin.calls("activity") == 1  # one request, one unit of budget; JetStream redelivers
    with pytest.raises(ProviderNotFound):
        provider.fetch_source(ctx(), job(99))


def test_the_environment_cannot_persist_sessions_or_override_the_ca(tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("x")
    settings = GarminSettings(ca_bundle=str(bundle))
    with pytest.raises(ConfigError, match="^GARTH_HOME: "):
        check_environment(settings, {"GARTH_HOME": "/tmp/garth"})
    with pytest.raises(ConfigError, match="^REQUESTS_CA_BUNDLE: "):
        check_environment(settings, {"REQUESTS_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt"})
    check_environment(settings, {"REQUESTS_CA_BUNDLE": str(bundle)})
    check_environment(GarminSettings(), {"REQUESTS_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt"})


def test_the_environment_cannot_switch_on_garths_telemetry() -> None:
    """garth would send each Garmin request's trace to Logfire's servers: a login's traffic to a third party."""
    with pytest.raises(ConfigError, match="^GARTH_TELEMETRY_ENABLED: "):
        check_environment(GarminSettings(), {"GARTH_TELEMETRY_ENABLED": "true"})
    with pytest.raises(ConfigError, match="^GARTH_TELEMETRY_SEND_TO_LOGFIRE: "):
        check_environment(GarminSettings(), {"GARTH_TELEMETRY_SEND_TO_LOGFIRE": "1"})
    check_environment(GarminSettings(), {"GARTH_TELEMETRY_ENABLED": "false"})


def test_the_manifest_declares_a_credentials_pool() -> None:
    meta = GarminProvider(GarminSettings()).manifest_meta()
    assert meta["auth_method"] == "credentials" and "oauth" not in meta
    assert [(f["key"], f.get("secret", False)) for f in meta["config_fields"]] == [("client_id", False),
                                                                                  ("client_secret", True)]
    assert meta["activity_url_template"] == "https://connect.garmin.com/modern/activity/{id}"
    assert meta["display_name"] and meta["setup_docs_url"].startswith("https://")
