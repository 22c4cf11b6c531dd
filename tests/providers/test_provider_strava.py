"""The Strava provider against the fake Strava API (devstack/fakes/strava/) on loopback.

Nothing of ours is mocked: the provider, its httpx client, usage parsing,
mapping and archive run for real; only Strava is a fake (it speaks the real
API's shapes, usage headers, 429s and OAuth token endpoint). The pure parts
without a server are in ``test_strava_mapping.py``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from devstack.fakes.strava import FakeStrava
from devstack.fakes.strava.data import blank_samples
from tests.kit.cairn_ctx import RecordingHook
from workers.errors import ConfigError, PermanentJobError, RetryableJobError
from workers.providers.context import ProviderContext
from workers.providers.errors import ProviderAuthError, ProviderNotFound, ProviderRateLimited
from workers.providers.models import DiscoverRequest, PoolIdentity
from workers.providers.registry import get_provider
from workers.providers.strava.provider import StravaProvider
from workers.providers.strava.settings import StravaSettings
from workers.providers.strava.usage import next_daily_reset, next_short_reset

ATHLETE = 4242
USER_ID = "7d1d9a8e-7a57-4a53-9b1e-1f0c0d7a0001"
ACCOUNT_ID = "0b6c2f0e-3c1a-4f5e-8a55-2a3f7d9e0002"


@dataclass
class Job:
    user_id: str = USER_ID
    account_id: str = ACCOUNT_ID
    ext_id: str = ""
    fetch_streams: bool = True


@pytest.fixture(scope="module")
def strava() -> Iterator[FakeStrava]:
    with FakeStrava() as fake:
        fake.add_athlete(ATHLETE, n_activities=12)
        yield fake


@pytest.fixture()
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10.0) as client:
        yield client


@pytest.fixture()
def provider(strava: FakeStrava) -> StravaProvider:
    return StravaProvider(StravaSettings(base_url=strava.base_url),
                          pool=PoolIdentity("strava-test", "switchyard.test"))


def ctx_for(strava: FakeStrava, http: httpx.Client, hook: RecordingHook | None = None,
            athlete: int = ATHLETE) -> ProviderContext:
    return ProviderContext(access_token=strava.athlete(athlete).access_token, http=http,
                           rate_limit=hook or RecordingHook())


def activity_with_gear(strava: FakeStrava, athlete: int = ATHLETE) -> dict:
    return next(a for a in strava.athlete(athlete).activities.values() if a.get("gear_id"))


# ---------------------------------------------------------------- against fake Strava


def test_fetch_source_emits_gear_before_activity_and_archives(strava: FakeStrava, http: httpx.Client,
                                                              provider: StravaProvider) -> None:
    act = activity_with_gear(strava)
    hook = RecordingHook()
    out = provider.fetch_source(ctx_for(strava, http, hook), Job(ext_id=str(act["id"])))
    assert [e["type"] for e in out.wire_events] == ["WORKER_EVENT_TYPE_GEAR", "WORKER_EVENT_TYPE_ACTIVITY"]
    gear = out.wire_events[0]["gear"]
    assert gear["ref"] == {"userId": USER_ID, "provider": "strava", "externalId": act["gear_id"],
                           "externalAccountId": ACCOUNT_ID}
    assert gear["payload"]["brand"] in ("Canyon", "Hoka")
    imported = out.activity
    assert imported["ref"]["externalId"] == str(act["id"]) and out.ext_id == str(act["id"])
    assert imported["payload"]["gearExternalId"] == act["gear_id"]
    assert imported["stream"]["sampleCount"] == len(strava.athlete(ATHLETE).streams[act["id"]]["time"]["data"])
    assert out.archive is not None and out.archive.dataset == 1 and out.gear_errors == 0
    envelope = json.loads(out.archive.body)
    assert envelope["version"] == 1 and envelope["activity"]["id"] == act["id"]
    assert envelope["provenance"]["worker_name"] == "strava-test" and "time" in envelope["streams"]
    assert envelope["gear"][0]["id"] == act["gear_id"]
    # every call reserved daily + short, every response synced the limiter
    assert hook.reserved and all(w == ("daily", "short") for w in hook.reserved)
    assert len(hook.observed) == len(hook.reserved)
    assert {w.window for w in hook.observed[0]} == {"short", "daily"}
    out.attach_raw_blob("users/u/strava/uploads/x", size_bytes=out.archive.size_bytes,
                        content_type="application/json")
    assert out.activity["rawBlobId"] == "users/u/strava/uploads/x"


def test_a_gap_in_the_streams_is_imported_as_nan_and_parses_strictly(strava: FakeStrava, http: httpx.Client,
                                                                     provider: StravaProvider) -> None:
    """A GPS and altimeter dropout: Strava sends ``null`` samples. They stay gaps (NaN, core's per-sample
    marker in a float column), written as protojson's ``"NaN"`` so core's strict parser takes them; a bare
    float NaN is refused by ``json_format.ParseDict`` and the whole import failed."""
    act = activity_with_gear(strava)
    gap = range(10, 20)
    blank_samples(strava.athlete(ATHLETE), act["id"], ("latlng", "altitude", "heartrate"), gap)
    job = Job(ext_id=str(act["id"]))
    out = provider.fetch_source(ctx_for(strava, http), job)
    (activity,) = [e.activity for e in out.events if e.HasField("activity")]  # strict, as core parses
    for column in (activity.stream.latitude, activity.stream.longitude, activity.stream.altitude_m):
        assert [math.isnan(v) for v in column[8:22]] == [False] * 2 + [True] * 10 + [False] * 2
    assert list(activity.stream.heart_rate_bpm[10:20]) == [0] * 10  # int columns are dense: 0, never NaN
    assert out.activity["stream"]["altitudeM"][10] == "NaN"
    assert out.archive is not None
    reparsed = provider.parse_blob(bytes(out.archive.body), job)  # the archive keeps Strava's nulls
    assert ([e.SerializeToString(deterministic=True) for e in reparsed.events]
            == [e.SerializeToString(deterministic=True) for e in out.events])


def test_parse_blob_of_the_archive_is_byte_identical(strava: FakeStrava, http: httpx.Client,
                                                     provider: StravaProvider) -> None:
    act = activity_with_gear(strava)
    job = Job(ext_id=str(act["id"]))
    imported = provider.fetch_source(ctx_for(strava, http), job)
    assert imported.archive is not None
    reparsed = StravaProvider(StravaSettings(base_url="https://unused.example")).parse_blob(
        bytes(imported.archive.body), Job(ext_id=""))  # ext id recovered from the archive
    dump = lambda events: json.dumps(events, sort_keys=True).encode()  # noqa: E731
    assert dump(reparsed.wire_events) == dump(imported.wire_events)
    assert reparsed.archive is None
    pb = pytest.importorskip("workers.cairn.contract.pb")
    assert pb is not None
    assert ([e.SerializeToString(deterministic=True) for e in reparsed.events]
            == [e.SerializeToString(deterministic=True) for e in imported.events])


@pytest.mark.parametrize("status", [500, 404, 429])
def test_gear_failure_never_fails_the_import(strava: FakeStrava, http: httpx.Client, status: int) -> None:
    fresh = StravaProvider(StravaSettings(base_url=strava.base_url))  # empty gear cache
    act = activity_with_gear(strava)
    strava.fail("gear", status)
    out = fresh.fetch_source(ctx_for(strava, http), Job(ext_id=str(act["id"])))
    assert [e["type"] for e in out.wire_events] == ["WORKER_EVENT_TYPE_ACTIVITY"]
    assert out.gear_errors == 1
    assert out.activity["payload"]["gearExternalId"] == act["gear_id"]
    assert out.activity["payload"]["gearName"] == act["gear"]["name"]  # display hint from the activity
    assert out.archive is not None
    assert "gear" not in json.loads(out.archive.body)


def test_gear_budget_denied_is_skipped_too(strava: FakeStrava, http: httpx.Client) -> None:
    fresh = StravaProvider(StravaSettings(base_url=strava.base_url))
    act = activity_with_gear(strava)
    out = fresh.fetch_source(ctx_for(strava, http, RecordingHook(deny_after=2)), Job(ext_id=str(act["id"])))
    assert out.gear_errors == 1 and len(out.wire_events) == 1


def test_429_raises_rate_limited_anchored_to_the_window(strava: FakeStrava, http: httpx.Client,
                                                        provider: StravaProvider) -> None:
    act_id = str(next(iter(strava.athlete(ATHLETE).activities)))
    hook = RecordingHook()
    strava.force_429(window="short")
    before = datetime.now(UTC)
    with pytest.raises(ProviderRateLimited) as info:
        provider.fetch_source(ctx_for(strava, http, hook), Job(ext_id=act_id))
    assert info.value.window == "short" and isinstance(info.value, RetryableJobError)
    assert info.value.reset_at in (next_short_reset(before), next_short_reset(datetime.now(UTC)))
    assert info.value.reset_at.minute % 15 == 0 and info.value.reset_at.second == 0
    assert hook.observed and hook.observed[-1]  # usage synced from the 429 itself
    strava.force_429(window="daily")
    with pytest.raises(ProviderRateLimited) as info:
        provider.fetch_source(ctx_for(strava, http), Job(ext_id=act_id))
    assert info.value.window == "daily" and info.value.reset_at == next_daily_reset(datetime.now(UTC))
    strava.force_429(window="short", retry_after_s=90)
    with pytest.raises(ProviderRateLimited) as info:
        provider.fetch_source(ctx_for(strava, http), Job(ext_id=act_id))
    assert 80 <= (info.value.reset_at - datetime.now(UTC)).total_seconds() <= 91


def test_status_mapping(strava: FakeStrava, http: httpx.Client, provider: StravaProvider) -> None:
    with pytest.raises(ProviderNotFound) as info:
        provider.fetch_source(ctx_for(strava, http), Job(ext_id="999"))
    assert info.value.code == "not_found" and info.value.error_class == "ERROR_CLASS_NOT_FOUND"
    with pytest.raises(ProviderAuthError) as auth:
        provider.fetch_source(ProviderContext(access_token="not-a-valid-token-123", http=http),
                              Job(ext_id="1"))
    assert auth.value.code == "needs_reauth" and isinstance(auth.value, PermanentJobError)
    act_id = str(next(iter(strava.athlete(ATHLETE).activities)))
    strava.fail("activity", 503)
    with pytest.raises(RetryableJobError):
        provider.fetch_source(ctx_for(strava, http), Job(ext_id=act_id))
    strava.fail("streams", 404)  # no stream is not an error
    out = provider.fetch_source(ctx_for(strava, http), Job(ext_id=act_id))
    assert "stream" not in out.activity
    with pytest.raises(PermanentJobError):
        provider.fetch_source(ctx_for(strava, http), Job(ext_id="../athlete"))


def test_list_activities_paginates_with_window_limit_and_exclude(strava: FakeStrava, http: httpx.Client,
                                                                 provider: StravaProvider) -> None:
    athlete = 5151
    strava.add_athlete(athlete, n_activities=230, with_gear=False)
    ctx = ctx_for(strava, http, athlete=athlete)
    strava.clear_requests()
    refs = provider.list_activities(ctx, after=None)
    pages = [r for r in strava.requests if r.endpoint == "list_activities"]
    assert len(refs) == 230 and len({r.ext_id for r in refs}) == 230
    assert [int(r.query["page"]) for r in pages] == [1, 2, 3]
    assert all(r.query["per_page"] == "100" for r in pages)
    ids = [r.ext_id for r in refs]
    limited = provider.list_activities(ctx, after=None, limit=150, exclude=ids[:120])
    assert [r.ext_id for r in limited] == ids[120:230][:110]  # limit never reached: all new ones
    limited = provider.list_activities(ctx, after=None, limit=5, exclude=ids[:2])
    assert [r.ext_id for r in limited] == ids[2:7]
    newest = max(r.start_time for r in refs)
    window = provider.list_activities(ctx, after=newest - timedelta(days=3))
    assert window and all(r.start_time > newest - timedelta(days=3) for r in window)
    assert all(r.start_time.tzinfo is not None for r in window)


def test_discover_pages_and_rate_limits(strava: FakeStrava, http: httpx.Client,
                                        provider: StravaProvider) -> None:
    athlete = 6161
    strava.add_athlete(athlete, n_activities=450, with_gear=False)
    reply = provider.discover(ctx_for(strava, http, athlete=athlete), DiscoverRequest(start_page=1))
    assert reply.complete and reply.items is not None and len(reply.items) == 450 and reply.error is None
    assert reply.items[0].item_type == "activity" and reply.items[0].item_time is not None
    assert reply.items[0].item_time.endswith("Z")
    assert reply.to_wire().keys() == {"items", "complete"}
    # budget gone after the first page: a partial, rate-limited reply naming where to resume
    partial = provider.discover(ctx_for(strava, http, RecordingHook(deny_after=1), athlete),
                                DiscoverRequest(start_page=1))
    assert partial.items is not None and len(partial.items) == 200 and partial.rate_limited and partial.next_page == 2
    assert not partial.complete
    none = provider.discover(ctx_for(strava, http, RecordingHook(deny_after=0), athlete),
                             DiscoverRequest(start_page=1))
    assert none.error and "rate_limited" in none.error and not none.items
    strava.fail("list_activities", 500)
    failed = provider.discover(ctx_for(strava, http, athlete=athlete), DiscoverRequest(start_page=2))
    assert failed.error and failed.to_wire()["items"] == []


def test_import_gear_lists_every_gear_including_retired(strava: FakeStrava, http: httpx.Client,
                                                        provider: StravaProvider) -> None:
    events = provider.import_gear(ctx_for(strava, http), Job())
    gear = {e["gear"]["ref"]["externalId"]: e["gear"]["payload"] for e in events}
    assert set(gear) == set(strava.athlete(ATHLETE).gear)
    assert sum(1 for g in gear.values() if g.get("retired")) == 2
    assert all(e["type"] == "WORKER_EVENT_TYPE_GEAR" for e in events)
    assert {g["kind"] for g in gear.values()} == {"bike", "shoes"}


def test_oauth_exchange_returns_athlete_id(strava: FakeStrava, http: httpx.Client,
                                           provider: StravaProvider) -> None:
    code = strava.issue_code(ATHLETE)
    tokens = provider.exchange_oauth(http, client_id=strava.client_id, client_secret=strava.client_secret,
                                     code=code, redirect_uri="https://cairn.example/auth/oauth/strava/callback")
    assert tokens.provider_account_id == str(ATHLETE)
    assert tokens.access_token == strava.athlete(ATHLETE).access_token and tokens.refresh_token
    assert tokens.expires_at > datetime.now(UTC) + timedelta(hours=5)
    wire = tokens.to_wire()
    assert wire["expires_at"].endswith("Z") and wire["provider_account_id"] == str(ATHLETE)
    with pytest.raises(ProviderAuthError):  # a code works once
        provider.exchange_oauth(http, client_id=strava.client_id, client_secret=strava.client_secret,
                                code=code, redirect_uri="x")
    refreshed = provider.refresh_oauth(http, client_id=strava.client_id, client_secret=strava.client_secret,
                                       refresh_token=tokens.refresh_token)
    assert refreshed.access_token


def test_secrets_never_reach_logs_or_exceptions(strava: FakeStrava, http: httpx.Client,
                                                provider: StravaProvider,
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    token = strava.athlete(ATHLETE).access_token
    texts: list[str] = []
    act = activity_with_gear(strava)
    ctx = ctx_for(strava, http)
    texts.append(repr(ctx))
    strava.fail("gear", 500)
    StravaProvider(StravaSettings(base_url=strava.base_url)).fetch_source(ctx, Job(ext_id=str(act["id"])))
    for failure in ("activity", 500), ("activity", 401), ("activity", 403):
        strava.fail(*failure)
        with pytest.raises(Exception) as info:
            provider.fetch_source(ctx, Job(ext_id=str(act["id"])))
        texts += [str(info.value), repr(info.value)]
    bad_secret = "wrong-" + strava.client_secret
    code = strava.issue_code(ATHLETE)
    with pytest.raises(ProviderAuthError) as info:
        provider.exchange_oauth(http, client_id=strava.client_id, client_secret=bad_secret,
                                code=code, redirect_uri="x")
    texts += [str(info.value), repr(info.value)]
    tokens = provider.exchange_oauth(http, client_id=strava.client_id, client_secret=strava.client_secret,
                                     code=code, redirect_uri="x")
    texts.append(repr(tokens))
    blob = "\n".join(texts) + caplog.text
    for secret in (token, strava.client_secret, bad_secret, code, tokens.access_token, tokens.refresh_token):
        assert secret not in blob


def test_registry_builds_strava_and_refuses_unknown(strava: FakeStrava,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_STRAVA_BASE_URL", strava.base_url)
    provider = get_provider("strava")
    assert isinstance(provider, StravaProvider) and provider.settings.base_url == strava.base_url
    meta = provider.manifest_meta()
    assert meta["auth_method"] == "oauth2" and meta["oauth"]["scope_separator"] == ","
    assert meta["oauth"]["authorize_url"] == strava.base_url + "/oauth/authorize"
    assert {f["key"] for f in meta["config_fields"]} == {"client_id", "client_secret"}
    caps = provider.declared_capabilities()
    assert {"fetch_source", "reconcile", "parse_blob", "import_gear"} == set(caps.jobs)
    assert "import_metrics" not in caps.jobs and "Gear" in caps.data_types
    monkeypatch.setenv("CAIRN_STRAVA_BASE_URL", "ftp://nope")
    with pytest.raises(ConfigError, match="CAIRN_STRAVA_BASE_URL"):
        get_provider("strava")
    with pytest.raises(ConfigError):
        get_provider("garmin-does-not-exist")
