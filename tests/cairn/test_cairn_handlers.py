"""Cairn job handlers against a real nats-server + JetStream, moto S3, the dev core and fake Strava.

Nothing of ours is mocked: the handlers, credentials RPCs, the KV rate limiter,
claim-check (presign → PUT → publish) and the Strava provider run for real.
Core and Strava are the dev doubles (deploy/devstack), which ingest strictly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import pytest
import redis

from devstack.fakes.cairn_core import DevCairnCore
from devstack.fakes.strava import FakeStrava
from devstack.infra.services import free_port
from tests.kit.cairn_ctx import (
    PACKAGE,
    PROVIDER,
    Athlete,
    admit_and_run,
    assert_json_and_secret_free,
    assert_naks_until_the_short_window,
    forget_budget,
    ingested_since,
)
from workers.cairn import sealed
from workers.cairn.contract import wire
from workers.cairn.contract.subjects import JOBS_STREAM
from workers.cairn.disposition import Disposition, ack, nak, term
from workers.cairn.handlers import Delivery, JobContext, discover, exchange
from workers.cairn.handlers.reconcile import RECONCILE_COALESCE_S, coalesce_key, window_start
from workers.cairn.handlers.run import run_job
from workers.cairn.outcomes import LEASE_NAMESPACE, MessageKey, OutcomeLedger
from workers.lease import Leases

# --------------------------------------------------------------------------- unit pieces


def test_disposition_constructors_are_json_and_redacted() -> None:
    assert ack().model_dump() == {"action": "ack", "delay_s": None, "reason": "", "counts_as_failure": False}
    assert nak(12.5, "rate").model_dump()["delay_s"] == 12.5
    assert term("gone").action == "term" and not term("gone").counts_as_failure
    restored = Disposition.model_validate(json.loads(json.dumps(nak(3).model_dump())))
    assert restored == nak(3)
    waiting = Disposition.model_validate(json.loads(json.dumps(nak(3, failure=False).model_dump())))
    assert waiting.action == "nak" and not waiting.counts_as_failure  # survives the result backend
    # a NAK from an older task image, without the field, counts as every NAK used to
    assert Disposition.model_validate({"action": "nak", "delay_s": 2.0}).counts_as_failure
    assert not Disposition.model_validate({"action": "ack", "counts_as_failure": True}).counts_as_failure
    leaky = term("url?X-Amz-Signature=abcdef123456&x=1")
    assert "abcdef123456" not in leaky.reason


def test_sealed_park_unpark_reads_once(fresh_redis: str) -> None:
    client = redis.Redis.from_url(fresh_redis)
    key = sealed.park(client, {"client_secret": "s3cr3t-value", "code": "c0de-value"}, 5.0)
    assert "s3cr3t" not in key and 0 < client.pttl(key) <= 5000
    assert sealed.unpark(client, key) == {"client_secret": "s3cr3t-value", "code": "c0de-value"}
    with pytest.raises(sealed.SealedMissing, match="gone"):
        sealed.unpark(client, key)
    assert sealed.unpark(client, key, missing_ok=True) is None


def test_reconcile_window_is_bounded() -> None:
    now = datetime(2026, 7, 1, tzinfo=UTC)
    assert window_start(None, now) == now - timedelta(days=30)
    assert window_start(now - timedelta(days=2), now) == now - timedelta(days=2, hours=1)
    assert window_start(now - timedelta(days=90), now) == now - timedelta(days=30)


# --------------------------------------------------------------------------- fetch_source


def test_fetch_source_end_to_end_claim_checked_with_stamp_and_gear_first(
        core: DevCairnCore, ctx: JobContext, athlete: Athlete, pool: str) -> None:
    before = len(core.ingested)
    job = athlete.fetch_job(0)
    disposition = admit_and_run(ctx, "fetch_source", job, Delivery(attempt=1, stream_seq=7))
    assert disposition.action == "ack", disposition
    [rec] = ingested_since(core, before)
    assert rec.claim_checked and rec.kind == "events" and rec.msg_id == f"result:{job['job_id']}:d1"
    data = rec.data
    assert (data["workerName"], data["workerVersion"], data["workerPackage"]) == (pool, "1.1", PACKAGE)
    types = [e["type"] for e in data["events"]]
    assert types[-1] == "WORKER_EVENT_TYPE_ACTIVITY" and "WORKER_EVENT_TYPE_GEAR" in types
    assert types.index("WORKER_EVENT_TYPE_GEAR") < types.index("WORKER_EVENT_TYPE_ACTIVITY")
    activity = data["events"][-1]["activity"]
    assert activity["ref"]["externalId"] == athlete.ext(0)
    raw_key = activity["rawBlobId"]
    assert raw_key.startswith(f"users/{athlete.user_id}/strava/") and core.blobs.exists(raw_key)
    raw = core.blobs.get(raw_key)
    assert raw is not None and json.loads(raw)["version"] == 1
    assert_json_and_secret_free(disposition.model_dump(), athlete.fake.access_token)


def test_rate_limited_naks_until_the_real_window_reset(core: DevCairnCore, ctx: JobContext,
                                                       athlete: Athlete, strava: FakeStrava) -> None:
    before = len(core.ingested) + len(core.rejected)
    strava.force_429(1, "short")
    started = datetime.now(UTC)
    disposition = admit_and_run(ctx, "fetch_source", athlete.fetch_job(1), 1)
    assert disposition.action == "nak"
    assert_naks_until_the_short_window(disposition.delay_s, started, datetime.now(UTC))
    assert "rate_limited" in disposition.reason
    assert not disposition.counts_as_failure  # waiting for the window is not failing
    assert len(core.ingested) + len(core.rejected) == before  # nothing published


def test_presign_failure_naks_and_the_retry_publishes(core: DevCairnCore, ctx: JobContext,
                                                      athlete: Athlete) -> None:
    job = athlete.fetch_job(2)
    before = len(core.ingested)
    core.inject_fault("presign_upload", {"error": "s3 unavailable"})
    first = admit_and_run(ctx, "fetch_source", job, 1)
    assert first.action == "nak" and first.delay_s and "transient" in first.reason
    assert first.counts_as_failure
    second = admit_and_run(ctx, "fetch_source", job, 2)
    assert second.action == "ack"
    [rec] = ingested_since(core, before)
    assert rec.msg_id == f"result:{job['job_id']}:d2"  # the retry publishes past the first's dedup


def test_not_found_publishes_failure_envelope_then_terms(core: DevCairnCore, ctx: JobContext,
                                                         athlete: Athlete, strava: FakeStrava) -> None:
    before = len(core.ingested)
    strava.fail("activity", 404)
    job = athlete.fetch_job(3)
    disposition = admit_and_run(ctx, "fetch_source", job, 2)
    assert disposition.action == "term" and disposition.reason.startswith("not_found")
    [rec] = ingested_since(core, before)
    data = rec.data
    assert rec.kind == "failure" and rec.msg_id == f"failed:strava:{athlete.ext(3)}:d2"
    assert data["error"]["code"] == "not_found" and data["error"]["class"] == "ERROR_CLASS_NOT_FOUND"
    assert data["failedRef"] == {"userId": athlete.user_id, "provider": PROVIDER,
                                 "externalAccountId": athlete.account_id, "externalId": athlete.ext(3)}
    assert "events" not in data and "payloadRef" not in data


@pytest.mark.parametrize(("fields", "problem"), [
    ({"start_date": None}, "no start time"),  # missing
    ({"start_date": "yesterday morning"}, "no start time"),  # unparseable
    ({"elapsed_time": 0}, "elapsed time not above zero"),
])
def test_unmappable_activity_terms_with_envelope_instead_of_publishing(
        core: DevCairnCore, ctx: JobContext, athlete: Athlete, strava: FakeStrava,
        fields: dict[str, Any], problem: str) -> None:
    """Contract §3 poison: core would NAK such a result to MaxDeliver and dead-letter it (reference §2.7)."""
    strava.patch_activity(athlete.id, int(athlete.ext(2)), **fields)
    before, rejected = len(core.ingested), len(core.rejected)
    job = athlete.fetch_job(2)
    disposition = admit_and_run(ctx, "fetch_source", job, Delivery(attempt=1, stream_seq=9))
    assert disposition.action == "term" and disposition.reason.startswith("unmappable"), disposition
    [rec] = ingested_since(core, before)
    assert rec.kind == "failure" and rec.msg_id == f"failed:strava:{athlete.ext(2)}:d1"
    assert rec.data["error"]["code"] == "unmappable" and problem in rec.data["error"]["message"]
    assert rec.data["error"]["class"] == "ERROR_CLASS_INVALID_INPUT"
    assert rec.data["failedRef"]["externalId"] == athlete.ext(2) and "events" not in rec.data
    assert len(core.rejected) == rejected  # no activity result reached core's ingest


def test_poison_payload_terms_with_envelope(core: DevCairnCore, ctx: JobContext, athlete: Athlete) -> None:
    before = len(core.ingested)
    job = athlete.fetch_job(0)
    del job["ext_id"]
    disposition = admit_and_run(ctx, "fetch_source", job, 1)
    assert disposition.action == "term" and "bad_payload" in disposition.reason
    [rec] = ingested_since(core, before)
    assert rec.kind == "failure" and rec.data["error"]["code"] == "bad_payload"


def test_unknown_account_terms(core: DevCairnCore, ctx: JobContext, athlete: Athlete) -> None:
    before = len(core.ingested)
    job = athlete.fetch_job(0, account_id=str(uuid.uuid4()))
    disposition = admit_and_run(ctx, "fetch_source", job, 1)
    assert disposition.action == "term" and disposition.reason.startswith("account_gone")
    assert ingested_since(core, before)[0].data["error"]["class"] == "ERROR_CLASS_AUTH_INVALID"


def test_transient_token_reply_naks_with_core_retry_after(core: DevCairnCore, ctx: JobContext,
                                                          athlete: Athlete) -> None:
    core.inject_fault("tokens.get", {"error": "transient", "retry_after": 30,
                                     "expires_at": "0001-01-01T00:00:00Z"})
    disposition = admit_and_run(ctx, "fetch_source", athlete.fetch_job(0), 1)
    assert disposition == nak(30.0, disposition.reason) and disposition.delay_s == 30.0


def test_creds_get_reads_the_slots_and_its_legacy_aliases_in_memory_only(
        core: DevCairnCore, ctx: JobContext, athlete: Athlete, strava: FakeStrava) -> None:
    """A credentials provider's per-job login (contract §9): slots first, 0.7 aliases as fallback."""
    from workers.cairn.credentials import CredentialsRevoked, fetch_creds
    from workers.logs import redact

    creds = fetch_creds(ctx, athlete.account_id)
    assert (creds.client_id, creds.client_secret) == (strava.client_id, strava.client_secret)
    assert strava.client_secret not in repr(creds) and strava.client_secret not in redact(strava.client_secret)
    core.inject_fault("creds.get", {"email": "login@example.test", "password": "alias-SECRET-pw"})
    assert (fetch_creds(ctx, athlete.account_id).client_secret) == "alias-SECRET-pw"
    with pytest.raises(CredentialsRevoked):
        fetch_creds(ctx, str(uuid.uuid4()))


# --------------------------------------------------------------------------- reconcile


def _drain_subjobs(ctx: JobContext, pool: str) -> list[Any]:
    """The sub-jobs the pool enqueued, taken off the queue as a consumer of core's would (the pool's
    own connection may not create that consumer: core's permission template)."""
    async def fetch() -> list[Any]:
        nc = await nats.connect(ctx.settings.nats_url)
        try:
            sub = await nc.jetstream().pull_subscribe(f"cairn.jobs.fetch_source.strava.{pool}", durable=f"t-{pool}")
            out: list[Any] = []
            while True:
                try:
                    msgs = await sub.fetch(50, timeout=0.5)
                except Exception:  # noqa: BLE001 - nats TimeoutError: nothing left
                    return out
                for m in msgs:
                    await m.ack()
                out.extend(msgs)
        finally:
            await nc.close()

    return asyncio.run(fetch())


def test_reconcile_enqueues_caps_publishes_and_coalesces(core: DevCairnCore, ctx: JobContext,
                                                         strava: FakeStrava, pool: str) -> None:
    ath = Athlete(core, strava, pool, n=10)
    known = [ath.ext(0), ath.ext(1)]
    before = len(core.ingested)
    job = {"job_id": str(uuid.uuid4()), "account_id": ath.account_id, "user_id": ath.user_id,
           "provider": PROVIDER, "max_enqueue": 5, "known_ext_ids": known, "reason": "scheduled"}
    disposition = admit_and_run(ctx, "reconcile", job, 1)
    assert disposition.action == "ack"
    [rec] = ingested_since(core, before)
    assert rec.kind == "reconcile" and rec.msg_id == f"result:{job['job_id']}"
    assert rec.subject == f"cairn.results.reconcile.strava.{ath.account_id}"
    assert rec.data["workerName"] == pool and "newWatermark" in rec.data
    assert core.account(ath.account_id).last_sync_at is not None
    subjobs = _drain_subjobs(ctx, pool)
    assert len(subjobs) == 5
    ids = {json.loads(m.data)["ext_id"] for m in subjobs}
    assert not ids & set(known)
    for m in subjobs:
        body = json.loads(m.data)
        assert m.headers["Nats-Msg-Id"] == f"reconcile:strava:{ath.account_id}:{body['ext_id']}"
        assert body["reason"] == "reconcile" and body["account_id"] == ath.account_id
    # A second reconcile of the same account inside the window: cheap ack, result still published.
    strava.clear_requests()
    again = dict(job, job_id=str(uuid.uuid4()), watermark="2026-01-01T00:00:00.123456789Z")
    before = len(core.ingested)
    coalesced = admit_and_run(ctx, "reconcile", again, 1)
    assert coalesced.action == "ack" and coalesced.reason == "coalesced"
    [rec2] = ingested_since(core, before)
    assert rec2.kind == "reconcile" and rec2.msg_id == f"result:{again['job_id']}"
    assert not strava.requests and not _drain_subjobs(ctx, pool)
    claim = f"cairn:reconcile:coalesce:{ctx.worker_name}:{ath.account_id}"  # the pool's claim on the account
    assert 0 < ctx.redis.ttl(claim) <= RECONCILE_COALESCE_S


def test_reconcile_with_nothing_new_still_publishes(core: DevCairnCore, ctx: JobContext,
                                                    strava: FakeStrava, pool: str) -> None:
    ath = Athlete(core, strava, pool, n=3)
    watermark = datetime.now(UTC) - timedelta(days=5)
    job = {"job_id": str(uuid.uuid4()), "account_id": ath.account_id, "user_id": ath.user_id,
           "provider": PROVIDER, "watermark": watermark.isoformat(),
           "known_ext_ids": [ath.ext(i) for i in range(3)]}
    before = len(core.ingested)
    assert admit_and_run(ctx, "reconcile", job, 1).action == "ack"
    [rec] = ingested_since(core, before)
    assert rec.kind == "reconcile"
    published = rec.result.new_watermark.ToDatetime(tzinfo=UTC)
    assert abs((published - watermark).total_seconds()) < 1  # echoed: nothing newer was enqueued
    assert not _drain_subjobs(ctx, pool)


def test_reconcile_without_user_id_answers_without_listing(core: DevCairnCore, ctx: JobContext,
                                                          strava: FakeStrava, pool: str) -> None:
    """The §10 harness body (no user_id, reference §5): a stamped result, no sub-job without an owner."""
    ath = Athlete(core, strava, pool, n=3)
    watermark = datetime.now(UTC).replace(microsecond=0) - timedelta(days=2)
    job = {"job_id": f"conformance-{uuid.uuid4().hex}", "account_id": ath.account_id, "provider": PROVIDER,
           "max_enqueue": 1, "watermark": watermark.isoformat()}
    strava.clear_requests()
    before = len(core.ingested)
    disposition = admit_and_run(ctx, "reconcile", job, 1)
    assert disposition.action == "ack" and "no user_id" in disposition.reason
    [rec] = ingested_since(core, before)
    assert rec.kind == "reconcile" and rec.subject == f"cairn.results.reconcile.strava.{ath.account_id}"
    assert rec.data["workerName"] == pool and "error" not in rec.data
    assert rec.result.new_watermark.ToDatetime(tzinfo=UTC) == watermark  # echoed, never advanced
    assert not strava.requests and not _drain_subjobs(ctx, pool)
    assert ctx.redis.get(coalesce_key(ctx.worker_name, ath.account_id)) is None  # claims no window


def test_reconcile_rate_limited_naks_and_releases_the_coalesce_claim(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, pool: str) -> None:
    ath = Athlete(core, strava, pool, n=3)
    job = {"job_id": str(uuid.uuid4()), "account_id": ath.account_id, "user_id": ath.user_id,
           "provider": PROVIDER}
    strava.force_429(1, "short")
    assert admit_and_run(ctx, "reconcile", job, 1).action == "nak"
    assert ctx.redis.get(coalesce_key(ctx.worker_name, ath.account_id)) is None
    forget_budget(ctx.nats)  # the 429 really spent the shared window
    assert admit_and_run(ctx, "reconcile", job, 2).action == "ack"


# --------------------------------------------------------------------------- parse_blob, gear


def test_parse_blob_is_byte_identical_to_the_import_and_re_presigns(
        core: DevCairnCore, ctx: JobContext, athlete: Athlete) -> None:
    before = len(core.ingested)
    job = athlete.fetch_job(4)
    assert admit_and_run(ctx, "fetch_source", job, 1).action == "ack"
    [imported] = ingested_since(core, before)
    raw_key = imported.data["events"][-1]["activity"]["rawBlobId"]
    cases = [
        core.blobs.presign_download(raw_key)["url"],  # valid URL
        core.blobs.presign_download(raw_key)["url"].replace("X-Amz-Signature=", "X-Amz-Signature=00"),  # 403
    ]
    for i, url in enumerate(cases):
        reparse = dict(job, job_id=f"reparse:{uuid.uuid4()}", min_parser_version="1.0",
                       blob={"url": url, "expires_at": (datetime.now(UTC) + timedelta(minutes=10)).isoformat(),
                             "fallback_handle": raw_key})
        start = len(core.ingested)
        assert admit_and_run(ctx, "parse_blob", reparse, 1).action == "ack", i
        [rec] = ingested_since(core, start)
        assert rec.job_type == "parse_blob" and rec.claim_checked
        assert wire.encode_result(rec.result) == wire.encode_result(imported.result), i
    expired = dict(job, job_id="reparse:expired", min_parser_version="1.0",
                   blob={"url": "http://127.0.0.1:9/gone", "expires_at": "2020-01-01T00:00:00Z",
                         "fallback_handle": raw_key})
    assert admit_and_run(ctx, "parse_blob", expired, 1).action == "ack"
    newer = dict(expired, job_id="reparse:newer", min_parser_version="1.7")
    refused = admit_and_run(ctx, "parse_blob", newer, 1)
    assert refused.action == "nak" and "parser" in refused.reason
    assert not refused.counts_as_failure  # left for a newer instance, not failed


def test_import_gear_one_event_per_gear_retired_included(core: DevCairnCore, ctx: JobContext,
                                                         athlete: Athlete) -> None:
    before = len(core.ingested)
    job = {"job_id": str(uuid.uuid4()), "account_id": athlete.account_id, "user_id": athlete.user_id,
           "provider": PROVIDER, "reason": "connect"}
    assert admit_and_run(ctx, "import_gear", job, 1).action == "ack"
    [rec] = ingested_since(core, before)
    events = rec.data["events"]
    assert rec.msg_id == f"result:{job['job_id']}" and not rec.claim_checked
    assert {e["gear"]["ref"]["externalId"] for e in events} == set(athlete.fake.gear)
    assert all(e["type"] == "WORKER_EVENT_TYPE_GEAR" for e in events)
    metrics = {"job_id": "m1", "account_id": athlete.account_id, "user_id": athlete.user_id,
               "provider": PROVIDER, "since_unix": 0, "until_unix": 1}
    assert admit_and_run(ctx, "import_metrics", metrics, 1).action == "term"  # Strava declares no metrics


# --------------------------------------------------------------------------- discover, exchange


def test_discover_shapes(ctx: JobContext, athlete: Athlete, strava: FakeStrava) -> None:
    reply = discover(ctx, {"account_id": athlete.account_id, "start_page": 1})
    assert reply["complete"] is True and len(reply["items"]) == 6
    assert {i["item_type"] for i in reply["items"]} == {"activity"}
    assert all(i["item_time"].endswith("Z") for i in reply["items"])
    strava.force_429(1, "short")
    limited = discover(ctx, {"account_id": athlete.account_id, "start_page": 1})
    assert "rate_limited" in limited["error"] and "items" not in limited
    gone = discover(ctx, {"account_id": str(uuid.uuid4()), "start_page": 1})
    assert gone == {"error": "account_gone"}
    assert discover(ctx, {"start_page": "x"}) == {"error": "bad_request"}
    strava.fail("list_activities", 500)
    failed = discover(ctx, {"account_id": athlete.account_id})
    assert failed["error"] and not failed.get("items")
    assert_json_and_secret_free([reply, limited, failed], athlete.fake.access_token, strava.client_secret)


def test_exchange_returns_athlete_id_and_errors(ctx: JobContext, athlete: Athlete, strava: FakeStrava,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="workers")
    code = strava.issue_code(athlete.id)
    request = {"connection_id": str(uuid.uuid4()), "client_id": strava.client_id,
               "client_secret": strava.client_secret, "code": code,
               "redirect_uri": "https://cairn.example/auth/oauth/strava/callback"}
    reply = exchange(ctx, request)
    assert reply["provider_account_id"] == str(athlete.id)
    assert reply["access_token"] and reply["token_type"] == "Bearer" and reply["expires_at"].endswith("Z")
    again = exchange(ctx, request)  # a code is single-use
    assert again["error"] == "exchange_failed" and code not in again["message"]
    assert exchange(ctx, {"client_id": "x"})["error"] == "bad_request"
    for secret in (strava.client_secret, code, reply["access_token"], reply["refresh_token"]):
        assert secret not in caplog.text


def test_no_token_reaches_logs_or_dispositions(core: DevCairnCore, ctx: JobContext, athlete: Athlete,
                                               strava: FakeStrava, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="workers")
    outcomes = [admit_and_run(ctx, "fetch_source", athlete.fetch_job(5), 1)]
    strava.fail("activity", 401)
    outcomes.append(admit_and_run(ctx, "fetch_source", athlete.fetch_job(1), 1))
    assert [o.action for o in outcomes] == ["ack", "term"]
    secrets = (athlete.fake.access_token, athlete.fake.refresh_token, strava.client_secret)
    assert_json_and_secret_free([o.model_dump() for o in outcomes], *secrets)
    for secret in secrets:
        assert secret not in caplog.text
    assert core.account(athlete.account_id).status == "needs_reauth"  # a 401 tells core


def test_a_lease_redis_cannot_take_hands_the_job_back_without_a_failure(core: DevCairnCore, ctx: JobContext) -> None:
    """Redis away when a task starts: no traceback, no failure counted, nothing run (R1); the bridge
    NAKs the message and a later delivery runs the job (test_cairn_outages rides the whole outage)."""
    # nothing listens there; retry=None is no retries to redis-py's Connection, Redis() annotates it as Retry only
    unreachable = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=None)  # type: ignore[arg-type]
    meta = {"stream": JOBS_STREAM, "seq": 1, "stamp": 1.0, "delivery": 1, "lease_token": "t-1"}
    job = {"job_id": "job-redis-away", "provider": "strava", "ext_id": "1"}  # never reached: nothing runs
    disposition = run_job(ctx, Leases(unreachable, LEASE_NAMESPACE), OutcomeLedger(unreachable), 30.0,
                          "fetch_source", job, meta)
    assert disposition.action == "nak" and not disposition.counts_as_failure, disposition
    assert "Redis unavailable" in disposition.reason


class ReleaseOnAClosedConnection(Leases):
    """The leases as a Sentinel failover left them for one call: the release's connection closed by Redis."""

    def release(self, job_id: str, value: str) -> bool:
        raise redis.ConnectionError("Connection closed by server.")


def test_a_release_redis_fails_still_answers_the_recorded_outcome(
        ctx: JobContext, athlete: Athlete, fresh_redis: str, caplog: pytest.LogCaptureFixture) -> None:
    """A failover under load: the job ran, its outcome was recorded and its result reached core, then the
    lease's release raised; the task failed, the bridge NAKed, and the next delivery ran the job again (a
    second result). The lease expires by itself: the job's outcome is the task's answer."""
    client = redis.Redis.from_url(fresh_redis)
    try:
        leases, ledger = ReleaseOnAClosedConnection(client, LEASE_NAMESPACE), OutcomeLedger(client)
        meta = {"stream": JOBS_STREAM, "seq": 7, "stamp": 1.0, "delivery": 1, "lease_token": "t-7"}
        key = MessageKey.from_meta(meta)
        assert leases.grant(key.id, "t-7", 30.0)
        with caplog.at_level(logging.INFO, logger="workers"):
            disposition = run_job(ctx, leases, ledger, 30.0, "fetch_source", athlete.fetch_job(5), meta)
        assert disposition.action == "ack", disposition
        assert ledger.get(key) == disposition
        assert "lease not released, Redis unavailable (ConnectionError)" in caplog.text
    finally:
        client.close()
