"""The dev Cairn core behaves like core 0.7 where workers can observe it.

Real nats-server and moto S3 (session fixtures); the "worker" side is a plain
nats-py client speaking the contract by hand, so these tests check the double
itself, not our worker.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import Coroutine, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import httpx
import nats
import pytest
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DiscardPolicy, RetentionPolicy

from devstack.fakes.cairn_core import Account, DevCairnCore, app_id_for
from devstack.fakes.cairn_core import bootstrap as bs

PROVIDER = "strava"
PACKAGE = "switchyard.providers.strava"
WAIT_S = 10.0
T = TypeVar("T")


@pytest.fixture(scope="module")
def core(nats_url: str, s3_endpoint: str) -> Iterator[DevCairnCore]:
    with DevCairnCore(nats_url, s3_endpoint, bucket="cairn-devstack-test") as dev:
        yield dev


@pytest.fixture()
def pool() -> str:
    """A fresh pool name per test, so results of other tests never match."""
    return f"pool-{uuid.uuid4().hex[:8]}"


@pytest.fixture()
def acct(core: DevCairnCore, pool: str) -> Account:
    return core.connect_account(PROVIDER, None, "access-1", "refresh-1", time.time() + 3600, worker_name=pool,
                                external_id=4242, client_id="client-1", client_secret="secret-1")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def request(url: str, subject: str, body: dict[str, Any], timeout_s: float = 2.0) -> Msg:
    nc = await nats.connect(url)
    try:
        return await nc.request(subject, json.dumps(body).encode(), timeout=timeout_s)
    finally:
        await nc.close()


def rpc(core: DevCairnCore, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    return json.loads(run(request(core.nats_url, subject, body)).data)


def iso(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def activity_result(acct: Account, pool: str, *, version: str = "1.0", ext_id: str = "1001",
                    start: datetime | None = None, package: str = PACKAGE) -> dict[str, Any]:
    start = start or datetime.now(UTC) - timedelta(hours=2)
    return {"workerName": pool, "workerVersion": version, "workerPackage": package, "events": [{
        "type": "WORKER_EVENT_TYPE_ACTIVITY", "activity": {
            "ref": {"userId": acct.user_id, "provider": PROVIDER, "externalAccountId": acct.account_id,
                    "externalId": ext_id},
            "payload": {"title": "Morning ride", "startTime": iso(start), "elapsedDuration": "3600s"}}}]}


async def _publish_claim_checked(url: str, pool: str, result: dict[str, Any], *, size_delta: int = 0,
                                 sha: str | None = None, job: str = "fetch_source") -> str:
    """Worker side of §5: marshal, presign, PUT with the required headers, publish the envelope."""
    body = json.dumps(result).encode()
    digest = hashlib.sha256(body).hexdigest()
    nc = await nats.connect(url)
    try:
        reply = await nc.request(f"cairn.blobs.presign_upload.{PROVIDER}", json.dumps({
            "kind": "result", "content_type": "application/json", "content_length": len(body),
            "content_sha256": digest}).encode(), timeout=2)
        presign = json.loads(reply.data)
        async with httpx.AsyncClient() as http:
            put = await http.put(presign["url"], content=body, headers=presign["required_headers"])
            assert put.status_code == 200, put.text
        envelope = {"workerName": result["workerName"], "workerVersion": result["workerVersion"],
                    "workerPackage": result["workerPackage"],
                    "payloadRef": {"blobId": presign["blob_id"], "sizeBytes": str(len(body) + size_delta),
                                   "contentType": "application/json", "contentSha256": sha or digest}}
        await nc.jetstream().publish(f"cairn.results.{job}.{PROVIDER}.{pool}", json.dumps(envelope).encode(),
                                     headers={"Nats-Msg-Id": f"result:{uuid.uuid4()}:d1"})
        return presign["blob_id"]
    finally:
        await nc.close()


async def _publish_inline(url: str, subject: str, raw: bytes) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().publish(subject, raw)
    finally:
        await nc.close()


def decided(core: DevCairnCore, pool: str) -> tuple[list[Any], list[Any]]:
    return ([r for r in core.ingested if pool in r.subject], [r for r in core.rejected if pool in r.subject])


def wait_decided(core: DevCairnCore, pool: str, n: int = 1) -> tuple[list[Any], list[Any]]:
    core.router.wait(lambda: sum(map(len, decided(core, pool))) >= n, WAIT_S, f"{n} results of {pool}")
    return decided(core, pool)


# ---- bootstrap ---------------------------------------------------------------------------------
def test_streams_buckets_and_router_consumer_match_core(core: DevCairnCore) -> None:
    jobs = core.stream_info(bs.STREAM_JOBS).config
    assert (jobs.subjects, jobs.retention, jobs.discard, jobs.duplicate_window) == (
        ["cairn.jobs.>"], RetentionPolicy.WORK_QUEUE, DiscardPolicy.NEW, 300.0)
    results = core.stream_info(bs.STREAM_RESULTS).config
    assert (results.subjects, results.retention, results.duplicate_window) == (
        ["cairn.results.>"], RetentionPolicy.INTEREST, 60.0)
    assert core.stream_info(bs.STREAM_EVENTS).config.max_age == 7 * 86400
    assert core.stream_info(bs.STREAM_DLQ).config.max_age == 30 * 86400
    webhooks = core.stream_info(bs.STREAM_WEBHOOKS).config
    assert webhooks.retention == RetentionPolicy.WORK_QUEUE and webhooks.max_age == 86400
    for name, ttl_s, history in (("cairn_worker_presence", 60, 1), ("cairn_worker_manifests", 900, 5),
                                 ("cairn_rate_limits", 900, 1), ("cairn_blob_handles", 7 * 86400, 1)):
        kv = core.stream_info(f"KV_{name}").config
        assert (kv.max_age, kv.max_msgs_per_subject) == (ttl_s, history), name
    assert core.kv_get("cairn_core", "info") == {"release": "v0.7.0"}
    router = next(c for c in core.consumers(bs.STREAM_RESULTS) if c["name"] == "ingest-router")
    assert (router["filter_subject"], router["ack_wait_s"], router["max_deliver"]) == ("cairn.results.>", 300.0, 5)


def test_release_info_is_configurable(core: DevCairnCore) -> None:
    core.set_release("v0.8.1", build="dev")
    try:
        assert core.kv_get("cairn_core", "info") == {"release": "v0.8.1", "build": "dev"}
    finally:
        core.set_release("v0.7.0")


# ---- tokens, creds, lookup ---------------------------------------------------------------------
def test_token_get_store_and_needs_reauth(core: DevCairnCore, acct: Account) -> None:
    got = rpc(core, "cairn.tokens.strava.get", {"account_id": acct.account_id})
    assert got["access_token"] == "access-1" and got["refresh_token"] == "refresh-1"
    assert got["token_type"] == "Bearer" and got["app_id"] == app_id_for("client-1")
    assert (got["client_id"], got["client_secret"]) == ("client-1", "secret-1")
    assert got["expires_at"].endswith("Z")
    assert rpc(core, "cairn.tokens.garmin.get", {"account_id": acct.account_id}) == {
        "expires_at": "0001-01-01T00:00:00Z", "error": "account_gone"}
    assert rpc(core, "cairn.tokens.strava.get", {"account_id": "nope"})["error"] == "bad_request"

    new_exp = iso(datetime.now(UTC) + timedelta(hours=6))
    stale = rpc(core, "cairn.tokens.strava.store", {"account_id": acct.account_id, "access_token": "x",
                                                    "expires_at": new_exp, "previous_expires_at": iso(
                                                        datetime.now(UTC) - timedelta(days=1))})
    assert stale == {"ok": False, "error": "stale_store"}
    stored = rpc(core, "cairn.tokens.strava.store", {"account_id": acct.account_id, "access_token": "access-2",
                                                     "expires_at": new_exp, "previous_expires_at": got["expires_at"]})
    assert stored == {"ok": True}
    again = rpc(core, "cairn.tokens.strava.get", {"account_id": acct.account_id})
    assert (again["access_token"], again["refresh_token"]) == ("access-2", "refresh-1")

    assert rpc(core, "cairn.tokens.strava.needs_reauth", {"account_id": acct.account_id, "reason": ""}) == {"ok": True}
    assert rpc(core, "cairn.tokens.strava.get", {"account_id": acct.account_id})["error"] == "account_gone"
    assert core.account(acct.account_id).needs_reauth_reason == "refresh_failed"
    deadline = time.monotonic() + WAIT_S  # the event is consumed by core's own reauth-notifier
    while not any(e["account_id"] == acct.account_id for e in core.reauth_events):
        assert time.monotonic() < deadline, "needs_reauth event never reached the notifier"
        time.sleep(0.02)


def test_injected_token_fault_then_normal(core: DevCairnCore, acct: Account) -> None:
    core.inject_fault("tokens.get", {"expires_at": "0001-01-01T00:00:00Z", "error": "transient",
                                     "retry_after": 30})
    assert rpc(core, "cairn.tokens.strava.get", {"account_id": acct.account_id})["error"] == "transient"
    assert rpc(core, "cairn.tokens.strava.get", {"account_id": acct.account_id})["access_token"] == "access-1"


def test_creds_and_account_lookup(core: DevCairnCore, acct: Account, pool: str) -> None:
    creds = rpc(core, "cairn.creds.strava.get", {"account_id": acct.account_id})
    assert (creds["client_id"], creds["client_secret"]) == ("client-1", "secret-1")
    assert rpc(core, "cairn.creds.garmin.get", {"account_id": acct.account_id}) == {"error": "account_gone"}
    found = rpc(core, f"cairn.accounts.lookup.strava.{pool}", {"external_id": "4242"})
    assert found == {"account_id": acct.account_id, "user_id": acct.user_id}
    assert rpc(core, "cairn.accounts.lookup.strava.other-pool", {"external_id": "4242"}) == {"error": "not_found"}
    acct.auto_import = False
    assert rpc(core, f"cairn.accounts.lookup.strava.{pool}", {"external_id": "4242"}) == {
        "error": "auto_import_suspended"}


# ---- presign -----------------------------------------------------------------------------------
def test_presign_upload_and_download_shapes(core: DevCairnCore, acct: Account) -> None:
    body = b'{"archive": 1}'
    digest = hashlib.sha256(body).hexdigest()
    up = rpc(core, "cairn.blobs.presign_upload.strava", {
        "kind": "raw", "user_id": acct.user_id, "source_id": "src-1", "content_type": "application/json",
        "content_length": len(body), "content_sha256": digest})
    assert up["method"] == "PUT" and up["blob_id"].startswith(f"users/{acct.user_id}/strava/sources/src-1/")
    assert {"Content-Type", "x-amz-checksum-sha256", "Host"} <= set(up["required_headers"])
    assert "X-Amz-Signature=" in up["url"] and "X-Amz-SignedHeaders=" in up["url"]  # SigV4, not SigV2
    assert httpx.put(up["url"], content=body, headers=up["required_headers"]).status_code == 200
    down = rpc(core, "cairn.blobs.presign_download.strava", {"blob_id": up["blob_id"], "handle": "x"})
    assert down["method"] == "GET" and down["blob_id"] == up["blob_id"] and "required_headers" not in down
    assert httpx.get(down["url"]).content == body
    result = rpc(core, "cairn.blobs.presign_upload.strava", {"kind": "result", "content_type": "application/json"})
    assert result["blob_id"].startswith("transfer/strava/") and result["blob_id"].endswith(".json")
    assert rpc(core, "cairn.blobs.presign_upload.strava", {"content_type": "text/plain"})["blob_id"].startswith(
        "shared/strava/")


@pytest.mark.parametrize(("subject", "body", "error"), [
    ("cairn.blobs.presign_upload.strava", {"kind": "result"}, "content_type required"),
    ("cairn.blobs.presign_upload.strava", {"content_type": "a/b", "content_sha256": "abc"}, "sha-256"),
    ("cairn.blobs.presign_upload.strava", {"content_type": "a/b", "user_id": str(uuid.uuid4())}, "no strava account"),
    ("cairn.blobs.presign_download.strava", {}, "blob_id required"),
    ("cairn.blobs.presign_download.strava", {"blob_id": "transfer/garmin/x.json"}, "outside"),
])
def test_presign_errors_are_plain_text_with_nats_error(core: DevCairnCore, subject: str, body: dict[str, Any],
                                                       error: str) -> None:
    reply = run(request(core.nats_url, subject, body))
    assert reply.headers is not None
    assert error in reply.headers["Nats-Error"] and error in reply.data.decode()


# ---- result router -----------------------------------------------------------------------------
def test_claim_checked_result_is_ingested_and_object_deleted(core: DevCairnCore, acct: Account, pool: str) -> None:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)
    blob_id = run(_publish_claim_checked(core.nats_url, pool, activity_result(acct, pool, start=start)))
    ok, bad = wait_decided(core, pool)
    assert bad == [] and len(ok) == 1
    item = ok[0]
    assert item.claim_checked and item.blob_id == blob_id and item.kind == "events"
    assert item.data["events"][0]["activity"]["ref"]["externalId"] == "1001"
    assert not core.blobs.exists(blob_id)
    assert core.account(acct.account_id).sync_watermark == start
    assert (PROVIDER, acct.account_id, "1001") in core.router.sources


@pytest.mark.parametrize("case", ["bad_sha", "bad_size", "unknown_field", "name_mismatch", "legacy_subject"])
def test_bad_results_are_rejected(core: DevCairnCore, acct: Account, pool: str, case: str) -> None:
    result = activity_result(acct, pool)
    if case == "bad_sha":
        run(_publish_claim_checked(core.nats_url, pool, result, sha="0" * 64))
        expected = "sha256_mismatch"
    elif case == "bad_size":
        run(_publish_claim_checked(core.nats_url, pool, result, size_delta=1))
        expected = "size_mismatch"
    elif case == "unknown_field":
        result["events"][0]["activity"]["payload"]["gearBrand"] = "not in the schema"
        run(_publish_claim_checked(core.nats_url, pool, result))
        expected = "bad_payload"
    elif case == "name_mismatch":
        result["workerName"] = "someone-else"
        run(_publish_inline(core.nats_url, f"cairn.results.fetch_source.strava.{pool}", json.dumps(result).encode()))
        expected = "worker_name_mismatch"
    else:
        run(_publish_inline(core.nats_url, f"cairn.results.fetch_source.strava.{pool}.x.y",
                            json.dumps(result).encode()))
        expected = "bad_subject"
    ok, bad = wait_decided(core, pool)
    assert ok == [] and [r.reason for r in bad] == [expected]


def test_version_never_goes_down_and_package_is_bound(core: DevCairnCore, acct: Account, pool: str) -> None:
    run(_publish_claim_checked(core.nats_url, pool, activity_result(acct, pool, version="1.2")))
    run(_publish_claim_checked(core.nats_url, pool, activity_result(acct, pool, version="1.1")))
    run(_publish_claim_checked(core.nats_url, pool, activity_result(acct, pool, version="1.3", package="other.pkg")))
    run(_publish_claim_checked(core.nats_url, pool, activity_result(acct, pool, version="2.0")))
    ok, bad = wait_decided(core, pool, 4)
    assert [r.reason for r in bad] == ["version_downgrade", "package_mismatch"]
    assert [r.data["workerVersion"] for r in ok] == ["1.2", "2.0"]


def test_reconcile_result_and_failure_envelope(core: DevCairnCore, acct: Account, pool: str) -> None:
    mark = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    inline = {"workerName": pool, "workerVersion": "1.0", "workerPackage": PACKAGE, "newWatermark": iso(mark)}
    run(_publish_inline(core.nats_url, f"cairn.results.reconcile.strava.{acct.account_id}",
                        json.dumps(inline).encode()))
    failure = {"error": {"class": "ERROR_CLASS_NOT_FOUND", "code": "not_found", "message": "gone"},
               "failedRef": {"userId": acct.user_id, "provider": PROVIDER, "externalAccountId": acct.account_id,
                             "externalId": "77"}}
    run(_publish_inline(core.nats_url, f"cairn.results.fetch_source.strava.{pool}", json.dumps(failure).encode()))
    core.router.wait(lambda: len([r for r in core.ingested if acct.account_id in r.subject or pool in r.subject]) >= 2,
                     WAIT_S, "reconcile + failure")
    kinds = {r.kind for r in core.ingested if acct.account_id in r.subject or pool in r.subject}
    assert kinds == {"reconcile", "failure"}
    assert core.account(acct.account_id).sync_watermark == mark
    assert core.account(acct.account_id).last_sync_at is not None


async def _publish_watching_terms(url: str, subjects_bodies: list[tuple[str, bytes]]) -> tuple[list[int], set[int]]:
    """Publish in order; return the stream sequences and those the router termed (JetStream's
    MSG_TERMINATED advisories), waiting for the last message's term: the router takes results in
    order, so every earlier message has been decided by then. The last one must be one it terms."""
    nc = await nats.connect(url)
    termed: set[int] = set()
    last_termed = asyncio.Event()
    seqs: list[int] = []

    async def on_term(msg: Msg) -> None:
        termed.add(int(json.loads(msg.data)["stream_seq"]))
        if seqs and seqs[-1] in termed:
            last_termed.set()

    try:
        await nc.subscribe(f"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{bs.STREAM_RESULTS}.>", cb=on_term)
        await nc.flush()
        js = nc.jetstream()
        for subject, body in subjects_bodies:
            seqs.append((await js.publish(subject, body)).seq)
        if seqs[-1] in termed:
            last_termed.set()
        await asyncio.wait_for(last_termed.wait(), WAIT_S)
    finally:
        await nc.close()
    return seqs, termed


def test_reconcile_result_on_any_other_subject_is_acked_and_applies_nothing(core: DevCairnCore, acct: Account,
                                                                           pool: str) -> None:
    """Reference §2.7: a result is a reconcile result only on exactly 5 tokens with a UUID account;
    core logs anything else and acks it, without a watermark or ``last_sync_at``."""
    mark = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    inline = json.dumps({"workerName": pool, "workerVersion": "1.0", "workerPackage": PACKAGE,
                         "newWatermark": iso(mark)}).encode()
    ignored = [f"cairn.results.reconcile.strava.{pool}.{acct.account_id}",  # the 6-token form
               f"cairn.results.reconcile.strava.{pool}"]  # 5 tokens, not a UUID
    termed_last = (f"cairn.results.fetch_source.strava.{pool}.x.y", inline)  # bad_subject: termed
    seqs, termed = run(_publish_watching_terms(core.nats_url, [(s, inline) for s in ignored] + [termed_last]))
    assert termed & set(seqs) == {seqs[-1]}  # the two reconcile results were acked, not termed
    ok, bad = decided(core, pool)
    assert ok == []
    assert [(r.subject, r.reason, r.acked) for r in bad] == [
        (s, "bad_reconcile_subject", True) for s in ignored] + [(termed_last[0], "bad_subject", False)]
    account = core.account(acct.account_id)
    assert account.sync_watermark is None and account.last_sync_at is None


# ---- jobs --------------------------------------------------------------------------------------
async def _fetch_one(url: str, subject: str) -> tuple[dict[str, Any], dict[str, str]]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        durable = "t-" + uuid.uuid4().hex[:8]
        sub = await js.pull_subscribe(subject, durable=durable, stream="CAIRN_JOBS",
                                      config=ConsumerConfig(filter_subject=subject, ack_wait=30))
        msg = (await sub.fetch(1, timeout=5))[0]
        await msg.ack_sync()
        await js.delete_consumer("CAIRN_JOBS", durable)
        return json.loads(msg.data), dict(msg.headers or {})
    finally:
        await nc.close()


def test_enqueue_job_lands_on_the_pool_subject(core: DevCairnCore, acct: Account, pool: str) -> None:
    payload = {"job_id": "j-1", "account_id": acct.account_id, "user_id": acct.user_id, "provider": PROVIDER,
               "ext_id": "555", "fetch_streams": True, "reason": "queue"}
    job = core.enqueue_job("fetch_source", payload, f"queue:strava:{acct.account_id}:555")
    assert job.subject == f"cairn.jobs.fetch_source.strava.{pool}" and not job.duplicate
    assert core.enqueue_job("fetch_source", payload, f"queue:strava:{acct.account_id}:555").duplicate
    body, headers = run(_fetch_one(core.nats_url, job.subject))
    assert body == payload and headers["Nats-Msg-Id"] == f"queue:strava:{acct.account_id}:555"


def test_schedule_reconcile_body_and_budget_gate(core: DevCairnCore, acct: Account, pool: str) -> None:
    live = {"worker_name": pool, "worker_key": f"{pool}-strava", "instance_id": "a", "version": "1.0",
            "provider": PROVIDER, "package": PACKAGE, "last_seen": iso(datetime.now(UTC)),
            "capabilities": {"Gear": {"read": True}}}
    core.kv_put("cairn_worker_presence", f"{pool}.a", live)
    assert [j.subject for j in core.schedule_reconcile(acct.account_id)] == [
        f"cairn.jobs.reconcile.strava.{pool}"]  # Gear in presence only: core reads the manifest (§4)
    core.kv_put("cairn_worker_manifests", pool, {"worker_name": pool, "provider": PROVIDER, "package": PACKAGE,
                                                 "version": "1.0", "capabilities": {"Gear": {"read": True}}})
    jobs = core.schedule_reconcile(acct.account_id)
    assert [j.subject for j in jobs] == [f"cairn.jobs.reconcile.strava.{pool}", f"cairn.jobs.import_gear.strava.{pool}"]
    body = jobs[0].payload
    assert body["max_enqueue"] == 500 and body["account_id"] == acct.account_id and body["reason"] == "manual"
    assert jobs[0].msg_id is not None
    assert jobs[0].msg_id.startswith(f"reconcile:{acct.account_id}:")
    reset = iso(datetime.now(UTC) + timedelta(minutes=10))
    core.kv_put("cairn_rate_limits", f"strava.{acct.app_id}.short",
                {"capacity": 100, "used": 100, "window_start": iso(datetime.now(UTC)), "window_reset_at": reset})
    assert core.schedule_reconcile(acct.account_id) == []
    assert core.schedule_reconcile(acct.account_id, force=True)[0].duplicate  # same minute → coalesced
    for subject in (jobs[0].subject, jobs[1].subject):
        run(_fetch_one(core.nats_url, subject))  # leave the work queue clean


def test_presence_reading_and_liveness(core: DevCairnCore, pool: str) -> None:
    fresh = {"worker_name": pool, "worker_key": f"{pool}-strava", "instance_id": "a", "version": "1.0",
             "provider": PROVIDER, "package": PACKAGE, "last_seen": iso(datetime.now(UTC))}
    stale = fresh | {"instance_id": "b", "last_seen": iso(datetime.now(UTC) - timedelta(minutes=5))}
    core.kv_put("cairn_worker_presence", f"{pool}.a", fresh)
    core.kv_put("cairn_worker_presence", f"{pool}.b", stale)
    assert set(core.presence(pool)) == {f"{pool}.a", f"{pool}.b"}
    assert set(core.live_presence(pool)) == {f"{pool}.a"}


def test_gear_results_inline_and_owner_check(core: DevCairnCore, acct: Account, pool: str) -> None:
    def gear_result(user_id: str) -> bytes:
        return json.dumps({"workerName": pool, "workerVersion": "1.0", "workerPackage": PACKAGE, "events": [{
            "type": "WORKER_EVENT_TYPE_GEAR", "gear": {
                "ref": {"userId": user_id, "provider": PROVIDER, "externalAccountId": acct.account_id,
                        "externalId": "b42"},
                "payload": {"name": "Road bike", "retired": True}}}]}).encode()

    subject = f"cairn.results.import_gear.strava.{pool}"
    run(_publish_inline(core.nats_url, subject, gear_result(acct.user_id)))
    run(_publish_inline(core.nats_url, subject, gear_result(str(uuid.uuid4()))))
    ok, bad = wait_decided(core, pool, 2)
    assert len(ok) == 1 and [r.reason for r in bad] == ["user_mismatch"]
    assert core.router.gear[(acct.account_id, "b42")].payload.retired
