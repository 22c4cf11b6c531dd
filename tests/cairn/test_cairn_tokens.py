"""The token refresh path (contract §9, reference §2.5, §3.7) against the dev core and fake Strava.

Real nats-server, Redis, moto S3 and our handlers; core's token store (with
its optimistic ``previous_expires_at`` check) and Strava's token endpoint
(refresh, rotation, revocation) are the dev doubles. An expired token is
expired on both sides: Strava refuses it (``expire_token``) and core's stored
expiry is in the past, so the worker must refresh before calling the API.

A gate in front of the fake's ``/oauth/token`` holds one instance's refresh
in flight while "another instance" (a second ``JobContext`` of the same pool)
refreshes and stores first: the store race is a state to wait for, not a
timing guess.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devstack.fakes.cairn_core import DevCairnCore
from devstack.fakes.strava import FakeStrava
from tests.kit.cairn_ctx import PROVIDER, Athlete, admit_and_run, ingested_since, job_context
from tests.kit.gate import Gate, GateMiddleware
from tests.kit.waiting import wait_until
from workers.cairn.disposition import Disposition
from workers.cairn.handlers import Delivery, JobContext

TOKEN_PATH = "/oauth/token"
RACE_TIMEOUT_S = 20.0  # the held instance's whole job, once the gate opens


@pytest.fixture(scope="module")
def gate() -> Gate:
    return Gate.path_suffix(TOKEN_PATH, once=True)


@pytest.fixture(scope="module")
def strava(gate: Gate) -> Iterator[FakeStrava]:
    fake = FakeStrava()
    fake.app.add_middleware(GateMiddleware, gate=gate)
    with fake:
        yield fake
    gate.open()


@pytest.fixture()
def expired(core: DevCairnCore, strava: FakeStrava, pool: str) -> Athlete:
    """An athlete whose access token is expired at Strava and in core's store."""
    ath = Athlete(core, strava, pool, n=3)
    strava.expire_token(ath.id)
    core.account(ath.account_id).expires_at = datetime.now(UTC) - timedelta(seconds=1)
    return ath


def token_calls(core: DevCairnCore, since: int) -> list[str]:
    return [name for name, _ in core.responders.calls[since:] if name.startswith("tokens.")]


def refreshes(strava: FakeStrava) -> list[int]:
    return [r.status for r in strava.requests if r.endpoint == "token"]


def run_in_thread(ctx: JobContext, job: dict[str, Any]) -> tuple[threading.Thread, list[Disposition]]:
    out: list[Disposition] = []
    thread = threading.Thread(target=lambda: out.append(admit_and_run(ctx, "fetch_source", job, 1)), daemon=True)
    thread.start()
    return thread, out


def test_expired_token_is_refreshed_stored_and_the_job_succeeds(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, expired: Athlete) -> None:
    old_token, calls, before = expired.fake.access_token, len(core.responders.calls), len(core.ingested)
    strava.clear_requests()
    disposition = admit_and_run(ctx, "fetch_source", expired.fetch_job(0), Delivery(attempt=1, stream_seq=3))
    assert disposition.action == "ack", disposition
    assert token_calls(core, calls) == ["tokens.get", "tokens.store"]
    assert refreshes(strava) == [200]
    acct, fresh = core.account(expired.account_id), strava.athlete(expired.id)
    assert acct.access_token == fresh.access_token != old_token  # stored back into core
    assert acct.refresh_token == fresh.refresh_token  # the rotated refresh token too
    assert acct.expires_at == datetime.fromtimestamp(fresh.expires_at, UTC)
    activity_calls = [r for r in strava.requests if r.endpoint == "activity"]
    assert [r.status for r in activity_calls] == [200]  # the API saw only the new token
    [rec] = ingested_since(core, before)
    assert rec.kind == "events"


def test_losing_the_store_race_reads_core_again(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, gate: Gate, expired: Athlete,
        nats_url: str, fresh_redis: str, pool: str) -> None:
    """Both instances refresh; the second store is ``stale_store`` and that instance uses core's token."""
    strava.rotate_refresh_tokens = False  # both refreshes succeed (Strava's long-time behaviour)
    try:
        calls = len(core.responders.calls)
        gate.arm()
        held, out = run_in_thread(ctx, expired.fetch_job(0))
        assert gate.arrived.wait(RACE_TIMEOUT_S), "the first instance never asked Strava for a refresh"
        with job_context(nats_url, fresh_redis, strava, pool, fresh_budget=False) as other:
            assert admit_and_run(other, "fetch_source", expired.fetch_job(1), 1).action == "ack"
        winner = core.account(expired.account_id).access_token
        gate.open()
        held.join(RACE_TIMEOUT_S)
        assert not held.is_alive() and out[0].action == "ack", out
    finally:
        gate.open()
        strava.rotate_refresh_tokens = True
    # held get, other get + store (ok), held store (stale) + get again
    assert token_calls(core, calls) == ["tokens.get", "tokens.get", "tokens.store", "tokens.store", "tokens.get"]
    assert core.account(expired.account_id).access_token == winner  # the loser did not overwrite it
    assert core.account(expired.account_id).status == "active"


def test_refresh_superseded_by_another_instance_uses_cores_token(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, gate: Gate, expired: Athlete,
        nats_url: str, fresh_redis: str, pool: str) -> None:
    """A rotating provider retires the refresh token the other instance used: its refusal is
    "superseded", not "revoked", when core already holds a newer token. No needs_reauth."""
    calls = len(core.responders.calls)
    strava.clear_requests()
    gate.arm()
    held, out = run_in_thread(ctx, expired.fetch_job(0))
    try:
        assert gate.arrived.wait(RACE_TIMEOUT_S), "the first instance never asked Strava for a refresh"
        with job_context(nats_url, fresh_redis, strava, pool, fresh_budget=False) as other:
            assert admit_and_run(other, "fetch_source", expired.fetch_job(1), 1).action == "ack"
    finally:
        gate.open()
    held.join(RACE_TIMEOUT_S)
    assert not held.is_alive() and out[0].action == "ack", out
    assert refreshes(strava) == [200, 400]  # the held refresh came too late: its token was rotated away
    assert "tokens.needs_reauth" not in token_calls(core, calls)
    assert core.account(expired.account_id).status == "active"
    assert not [e for e in core.reauth_events if e.get("account_id") == expired.account_id]


def test_refused_refresh_reports_needs_reauth_and_terms_with_envelope(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, expired: Athlete) -> None:
    strava.revoke(expired.id)  # the user deauthorized the app: the refresh token is dead too
    calls, before = len(core.responders.calls), len(core.ingested)
    job = expired.fetch_job(0)
    disposition = admit_and_run(ctx, "fetch_source", job, Delivery(attempt=2, stream_seq=5))
    assert disposition.action == "term" and disposition.reason.startswith("needs_reauth"), disposition
    assert token_calls(core, calls) == ["tokens.get", "tokens.get", "tokens.needs_reauth"]
    acct = core.account(expired.account_id)
    assert acct.status == "needs_reauth" and acct.needs_reauth_reason == "invalid_grant"
    wait_until(lambda: any(e.get("account_id") == expired.account_id for e in core.reauth_events),
               RACE_TIMEOUT_S, "the needs_reauth event on CAIRN_EVENTS")
    [rec] = ingested_since(core, before)
    assert rec.kind == "failure" and rec.msg_id == f"failed:strava:{expired.ext(0)}:d2"
    assert rec.data["error"]["code"] == "needs_reauth" and rec.data["error"]["class"] == "ERROR_CLASS_AUTH_EXPIRED"
    assert rec.data["failedRef"] == {"userId": expired.user_id, "provider": PROVIDER,
                                     "externalAccountId": expired.account_id, "externalId": expired.ext(0)}
    assert not [r for r in strava.requests if r.endpoint == "activity" and r.athlete_id == expired.id]
