"""Claim-check end to end: real nats-server (JetStream), moto S3 (server mode), a minimal presign responder.

The responder plays Cairn core's presign subjects as reference §2.6 describes
them (key layout, ``required_headers`` with the SigV4-signed checksum, plain
text + ``Nats-Error`` on refusal); boto3 signs with s3v4 against moto. The
claim-check code under test is the real one.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.config import Config

from devstack.infra import services
from workers.cairn.claimcheck import ClaimCheck, PresignError, UploadError, WorkerStamp
from workers.cairn.contract import subjects, wire
from workers.cairn.contract.pb.cairn.worker.v1 import worker_pb2 as pb
from workers.cairn.nats_conn import NatsThread
from workers.cairn.settings import CairnSettings

BUCKET = "cairn-test"
PROVIDER = "strava"
POOL = "strava-fetcher"
USER = "5b0c8f7e-6a43-4c1e-9a55-0f1f2f3a4b5c"
ACCOUNT = "9e3f1a2b-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
STAMP = WorkerStamp(POOL, "1.0", "switchyard.providers.strava")
RESULT_SUBJECT = subjects.result_subject("fetch_source", PROVIDER, POOL)


class PresignResponder:
    """Core's presign_upload/presign_download responders, reduced to what the worker relies on."""

    def __init__(self, s3: Any) -> None:
        self.s3 = s3
        self.mode = "ok"  # ok | refuse | silent | bad_bucket
        self.requests: list[dict[str, Any]] = []

    async def on_upload(self, msg: Any) -> None:
        req = json.loads(msg.data)
        self.requests.append(req)
        if self.mode == "silent":
            return
        if self.mode == "refuse" or not req.get("content_type"):
            await msg.respond(b"content_type required", headers={"Nats-Error": "content_type required"})
            return
        provider = req.get("provider") or "unknown"
        uid = uuid.uuid4()
        if req.get("kind") == "result":
            key = f"transfer/{provider}/{uid}.json"
        elif req.get("user_id"):
            key = f"users/{req['user_id']}/{provider}/uploads/{uid}"
        else:
            key = f"shared/{provider}/{uid}"
        params: dict[str, Any] = {"Bucket": "missing-bucket" if self.mode == "bad_bucket" else BUCKET,
                                  "Key": key, "ContentType": req["content_type"]}
        headers = {"Content-Type": req["content_type"]}
        if req.get("content_sha256"):
            checksum = base64.b64encode(binascii.unhexlify(req["content_sha256"])).decode()
            params["ChecksumSHA256"] = checksum
            headers["x-amz-checksum-sha256"] = checksum
        url = self.s3.generate_presigned_url("put_object", Params=params, ExpiresIn=900)
        assert "X-Amz-Signature=" in url  # s3v4, not the SigV2 default
        await msg.respond(json.dumps({"method": "PUT", "url": url, "blob_id": key,
                                      "expires_at": "2026-07-20T12:15:00.123Z",
                                      "required_headers": headers}).encode())

    async def on_download(self, msg: Any) -> None:
        req = json.loads(msg.data)
        url = self.s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": req["blob_id"]})
        await msg.respond(json.dumps({"method": "GET", "url": url, "blob_id": req["blob_id"]}).encode())


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    with services.nats_server() as nats_svc, services.moto_s3() as s3_svc:
        s3 = boto3.client("s3", endpoint_url=s3_svc.url, region_name="us-east-1", aws_access_key_id="test",
                          aws_secret_access_key="test",
                          config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
        s3.create_bucket(Bucket=BUCKET)
        core = NatsThread(CairnSettings(nats_url=nats_svc.url, worker_name="cairn-core"))
        responder = PresignResponder(s3)
        nc, js = core.nc, core.js

        async def setup() -> Any:
            from nats.js.api import ConsumerConfig, RetentionPolicy, StreamConfig

            await js.add_stream(StreamConfig(name=subjects.JOBS_STREAM, subjects=["cairn.jobs.>"],
                                             retention=RetentionPolicy.WORK_QUEUE, duplicate_window=300))
            await js.add_stream(StreamConfig(name=subjects.RESULTS_STREAM, subjects=["cairn.results.>"],
                                             retention=RetentionPolicy.INTEREST, duplicate_window=60))
            await nc.subscribe("cairn.blobs.presign_upload.*", cb=responder.on_upload)
            await nc.subscribe("cairn.blobs.presign_download.*", cb=responder.on_download)
            return await js.pull_subscribe("cairn.results.>", durable="ingest-router",
                                           config=ConsumerConfig(ack_wait=30))

        results = core.run(setup(), 10)
        worker = NatsThread(CairnSettings(nats_url=nats_svc.url, worker_name=POOL))
        yield {"s3": s3, "core": core, "worker": worker, "responder": responder, "results": results}
        worker.close()
        core.run(results.unsubscribe(), 5)  # a pull subscription with an open request slows drain
        core.close()


@pytest.fixture()
def check(stack: dict[str, Any]) -> Iterator[ClaimCheck]:
    stack["responder"].mode = "ok"
    stack["responder"].requests.clear()
    cc = ClaimCheck(stack["worker"], provider=PROVIDER, stamp=STAMP)
    yield cc
    cc.http.close()


def next_results(stack: dict[str, Any], at_most: int = 10, timeout_s: float = 2.0) -> list[Any]:
    async def fetch() -> list[Any]:
        try:
            msgs = await stack["results"].fetch(batch=at_most, timeout=timeout_s)
        except TimeoutError:  # nats.errors.TimeoutError or a bare asyncio timeout: nothing arrived
            return []
        for m in msgs:
            await m.ack()
        return msgs

    return stack["core"].run(fetch(), timeout_s + 5)


def activity_result(ext_id: str = "123") -> pb.JobResult:
    result = pb.JobResult(new_watermark=wire.timestamp(datetime(2026, 7, 1, 8, tzinfo=UTC)))
    act = result.events.add(type=pb.WORKER_EVENT_TYPE_ACTIVITY).activity
    act.ref.user_id, act.ref.provider, act.ref.external_account_id, act.ref.external_id = (
        USER, PROVIDER, ACCOUNT, ext_id)
    act.payload.title = "Morning ride " + "x" * 2000
    act.payload.start_time.FromSeconds(1_780_000_000)
    act.payload.elapsed_duration.FromSeconds(3600)
    return result


def test_claim_check_end_to_end(stack: dict[str, Any], check: ClaimCheck) -> None:
    msg_id = subjects.activity_result_msg_id("job-1", 2)
    blob = check.publish_claim_checked(RESULT_SUBJECT, activity_result(), msg_id)

    req = stack["responder"].requests[-1]
    assert req["kind"] == "result" and req["provider"] == PROVIDER
    assert req["content_type"] == "application/json" and req["content_length"] == blob.size_bytes
    assert req["content_sha256"] == blob.content_sha256 and blob.blob_id.startswith("transfer/strava/")

    [msg] = next_results(stack)
    assert msg.subject == RESULT_SUBJECT and msg.headers["Nats-Msg-Id"] == "result:job-1:d2"
    envelope = wire.decode_result(msg.data)  # strict, as core parses
    assert len(envelope.events) == 0
    assert (envelope.worker_name, envelope.worker_version, envelope.worker_package) == (
        STAMP.worker_name, STAMP.worker_version, STAMP.worker_package)
    assert envelope.payload_ref.blob_id == blob.blob_id
    assert envelope.payload_ref.size_bytes == blob.size_bytes
    assert envelope.payload_ref.content_sha256 == blob.content_sha256
    assert envelope.new_watermark.ToSeconds() == 1_782_892_800
    assert json.loads(msg.data)["payloadRef"]["sizeBytes"] == str(blob.size_bytes)

    stored = stack["s3"].get_object(Bucket=BUCKET, Key=blob.blob_id)
    body = stored["Body"].read()
    assert stored["ContentType"] == "application/json"
    assert wire.sha256_hex(body) == blob.content_sha256  # moto does not check it: we do
    full = wire.decode_result(body)
    assert full.worker_name == POOL and full.events[0].activity.ref.external_id == "123"


def test_same_msg_id_is_deduplicated(stack: dict[str, Any], check: ClaimCheck) -> None:
    msg_id = subjects.activity_result_msg_id("job-dup", 1)
    check.publish_claim_checked(RESULT_SUBJECT, activity_result(), msg_id)
    check.publish_claim_checked(RESULT_SUBJECT, activity_result(), msg_id)
    assert [m.headers["Nats-Msg-Id"] for m in next_results(stack, timeout_s=1.0)] == [msg_id]


def test_event_free_results_go_inline(stack: dict[str, Any], check: ClaimCheck) -> None:
    subject = subjects.reconcile_result_subject(PROVIDER, ACCOUNT)
    assert check.publish_result(subject, pb.JobResult(), subjects.result_msg_id("rec-1")) is None
    [msg] = next_results(stack)
    assert msg.subject == subject and msg.headers["Nats-Msg-Id"] == "result:rec-1"
    assert wire.decode_result(msg.data).worker_name == POOL
    assert stack["responder"].requests == []  # no presign for an inline result


@pytest.mark.parametrize("mode", ["refuse", "silent"])
def test_presign_failure_raises_and_publishes_nothing(stack: dict[str, Any], check: ClaimCheck,
                                                      mode: str) -> None:
    stack["responder"].mode = mode
    check.presign_timeout_s = 0.5
    check.presign_retry_bound_s = 0.0  # an unanswered presign is asked again for a minute: not here
    with pytest.raises(PresignError) as err:
        check.publish_claim_checked(RESULT_SUBJECT, activity_result(), "result:job-fail:d1")
    assert err.value.code == "presign_failed"
    assert next_results(stack, timeout_s=0.5) == []


def test_no_presign_responder_raises(stack: dict[str, Any]) -> None:
    cc = ClaimCheck(stack["worker"], provider="garmin", stamp=STAMP)  # nothing answers garmin? core answers *.
    cc.presign_timeout_s = 0.5
    cc.presign_retry_bound_s = 0.0  # an unanswered presign is asked again for a minute: not here
    stack["responder"].mode = "silent"
    with pytest.raises(PresignError):
        cc.publish_claim_checked(RESULT_SUBJECT, activity_result(), "result:job-none:d1")
    cc.http.close()


def test_put_failure_raises_without_leaking_the_signature(stack: dict[str, Any], check: ClaimCheck) -> None:
    stack["responder"].mode = "bad_bucket"
    with pytest.raises(UploadError) as err:
        check.publish_claim_checked(RESULT_SUBJECT, activity_result(), "result:job-put:d1")
    assert "HTTP 404" in str(err.value)
    assert "Signature" not in str(err.value) and "X-Amz" not in str(err.value)
    assert next_results(stack, timeout_s=0.5) == []


def test_raw_upload_is_user_scoped_and_reads_back_through_a_fresh_presign(stack: dict[str, Any],
                                                                          check: ClaimCheck) -> None:
    body = json.dumps({"version": 1, "activity": {"id": 123, "name": "Ride"}}).encode()
    blob = check.upload(kind="raw", body=body, content_type="application/json", user_id=USER)
    req = stack["responder"].requests[-1]
    assert req["kind"] == "raw" and req["user_id"] == USER
    assert blob.blob_id.startswith(f"users/{USER}/strava/")
    assert stack["s3"].get_object(Bucket=BUCKET, Key=blob.blob_id)["Body"].read() == body
    # the archived object comes back through a fresh presigned GET (parse_blob's fallback handle)
    url = check.presign_download(blob.blob_id).url
    assert check.get(url).content == body
