"""Cairn wire layer without services: protojson, generated modules, job/reply models, settings, subjects."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from pydantic import ValidationError

from workers.cairn.contract import jobs, messages, proto_build, subjects, wire
from workers.cairn.contract.pb.cairn.v1 import activity_pb2 as apb
from workers.cairn.contract.pb.cairn.worker.v1 import worker_pb2 as pb
from workers.cairn.settings import WORKER_VERSION, load_cairn_settings
from workers.errors import ConfigError
from workers.logs import RedactingFilter, redact
from workers.providers.models import DiscoverReply, DiscoverRequest, OAuthTokens
from workers.providers.registry import get_provider
from workers.providers.strava.dataset import PARSER_VERSION
from workers.providers.strava.settings import StravaSettings

ROOT = Path(__file__).resolve().parents[2]
USER = "5b0c8f7e-6a43-4c1e-9a55-0f1f2f3a4b5c"
ACCOUNT = "9e3f1a2b-1c2d-4e5f-8a9b-0c1d2e3f4a5b"


def activity_result() -> pb.JobResult:
    result = pb.JobResult(worker_name="strava-fetcher", worker_version="1.0", worker_package="switchyard.strava")
    event = result.events.add(type=pb.WORKER_EVENT_TYPE_ACTIVITY)
    act = event.activity
    act.ref.user_id, act.ref.provider, act.ref.external_account_id, act.ref.external_id = (
        USER, "strava", ACCOUNT, "123")
    act.raw_blob_id = f"users/{USER}/strava/uploads/abc"
    act.raw_size_bytes = 1234
    act.payload.type = apb.ACTIVITY_TYPE_RIDE
    act.payload.start_time.FromDatetime(datetime(2026, 7, 1, 8, 0, tzinfo=UTC))
    act.payload.elapsed_duration.FromSeconds(3600)
    act.payload.summary.avg_heart_rate_bpm = 0  # proto3 optional: emitted even at zero
    act.payload.gear_external_id = "b123"
    act.stream.sample_count = 2
    act.stream.time_s.extend([0.0, 1.0])
    act.stream.latitude.extend([float("nan"), 47.1])
    return result


def test_protojson_names_enums_int64_and_times() -> None:
    body = json.loads(wire.encode_result(activity_result()))
    assert body["workerName"] == "strava-fetcher" and "worker_name" not in body
    event = body["events"][0]
    assert event["type"] == "WORKER_EVENT_TYPE_ACTIVITY"
    activity = event["activity"]
    assert activity["rawSizeBytes"] == "1234"  # int64 as a JSON string
    assert activity["payload"]["type"] == "ACTIVITY_TYPE_RIDE"
    assert activity["payload"]["startTime"] == "2026-07-01T08:00:00Z"
    assert activity["payload"]["elapsedDuration"] == "3600s"
    assert activity["payload"]["summary"] == {"avgHeartRateBpm": 0}
    assert activity["stream"]["latitude"][0] == "NaN"
    assert "moreAvailable" not in body  # zero-valued scalars are omitted


def test_round_trip_is_lossless() -> None:
    original = activity_result()
    decoded = wire.decode_result(wire.encode_result(original))
    assert decoded.events[0].activity.payload.gear_external_id == "b123"
    decoded.events[0].activity.stream.ClearField("latitude")  # NaN != NaN
    original.events[0].activity.stream.ClearField("latitude")
    assert decoded == original


@pytest.mark.parametrize("mutate", [
    lambda b: b.update(manifestHash="x"),  # reserved field 6
    lambda b: b.update(unknownField=1),
    lambda b: b["events"][0].update(type="WORKER_EVENT_TYPE_PHOTO"),  # unknown enum name
    lambda b: b["events"][0]["activity"].update(photos=[]),
])
def test_strict_decode_rejects_what_core_rejects(mutate: Callable[[dict[str, Any]], object]) -> None:
    body = json.loads(wire.encode_result(activity_result()))
    mutate(body)
    with pytest.raises(json_format.ParseError):
        wire.decode_result(json.dumps(body).encode())
    with pytest.raises(json_format.ParseError):
        wire.result_from_dict(body)


def test_decode_accepts_snake_case_and_numeric_int64() -> None:
    body = {"worker_name": "p", "payloadRef": {"blobId": "transfer/strava/x.json", "sizeBytes": 42}}
    result = wire.decode_result(json.dumps(body))
    assert result.worker_name == "p" and result.payload_ref.size_bytes == 42


def test_gear_event_has_our_marked_numbers() -> None:
    assert pb.WorkerEventType.Value("WORKER_EVENT_TYPE_GEAR") == 6
    assert pb.WorkerEvent.DESCRIPTOR.fields_by_name["gear"].number == 7
    result = pb.JobResult()
    gear = result.events.add(type=pb.WORKER_EVENT_TYPE_GEAR).gear
    gear.ref.external_id, gear.payload.name, gear.payload.retired = "b1", "Canyon", True
    body = json.loads(wire.encode_result(result))
    assert body["events"][0] == {"type": "WORKER_EVENT_TYPE_GEAR",
                                 "gear": {"ref": {"externalId": "b1"},
                                          "payload": {"name": "Canyon", "retired": True}}}
    text = (ROOT / "proto/cairn/worker/v1/worker.proto").read_text()
    assert text.count("Switchyard-assigned") >= 3


def test_failure_envelope_carries_only_error_and_ref() -> None:
    result = wire.failure_envelope(code="not_found", message="gone", user_id=USER, provider="strava",
                                   account_id=ACCOUNT, external_id="123")
    body = json.loads(wire.encode_result(result))
    assert set(body) == {"error", "failedRef"}
    assert body["error"] == {"class": "ERROR_CLASS_NOT_FOUND", "code": "not_found", "message": "gone"}


def test_sha256_and_time_helpers() -> None:
    data = b"{}"
    hex_digest = wire.sha256_hex(data)
    assert len(hex_digest) == 64 and hex_digest == hex_digest.lower()
    assert wire.hex_to_b64(hex_digest) == wire.sha256_b64(data)
    with pytest.raises(ValueError):
        wire.hex_to_b64("abcd")
    assert wire.rfc3339(datetime(2026, 1, 2, 3, 4, 5, 120000, tzinfo=UTC)) == "2026-01-02T03:04:05.12Z"
    with pytest.raises(ValueError):
        wire.rfc3339(datetime(2026, 1, 2))
    assert wire.parse_rfc3339("2026-07-20T12:00:00.123456789Z") == datetime(2026, 7, 20, 12, 0, 0, 123456,
                                                                          tzinfo=UTC)
    assert wire.parse_rfc3339(wire.GO_ZERO_TIME) is None


def test_generated_modules_match_the_protos(tmp_path: Path) -> None:
    assert proto_build.build(tmp_path) == 0
    committed = ROOT / "workers/cairn/contract/pb"
    for generated in tmp_path.rglob("*_pb2.py"):
        rel = generated.relative_to(tmp_path)
        assert generated.read_text() == (committed / rel).read_text(), f"regenerate {rel}"
        assert "from cairn." not in generated.read_text()


# --------------------------------------------------------------------------- job payloads

def test_fetch_source_ignores_unknown_and_requires_ext_id() -> None:
    job = jobs.parse_job("fetch_source", {"job_id": "q1", "account_id": ACCOUNT, "user_id": USER,
                                          "provider": "strava", "ext_id": "9", "reason": "queue",
                                          "aspect_type": "create"})
    assert isinstance(job, jobs.FetchSourceJob)
    assert job.ext_id == "9" and job.fetch_streams is True
    with pytest.raises(ValidationError):
        jobs.parse_job("fetch_source", {"job_id": "q1", "account_id": ACCOUNT, "user_id": USER})


def test_reconcile_parse_blob_metrics_gear_backfill() -> None:
    rec = jobs.parse_job("reconcile", {"job_id": "r", "account_id": ACCOUNT, "user_id": USER,
                                       "watermark": "2026-07-20T12:00:00.123456789Z", "known_ext_ids": None,
                                       "webhook_seen": True, "issued_at": "2026-07-20T12:00:00Z"})
    assert isinstance(rec, jobs.ReconcileJob) and rec.watermark is not None
    assert rec.watermark.tzinfo is not None and rec.known_ext_ids == [] and rec.max_enqueue == 500
    # Go's zero time.Time is "no watermark": the window then starts 30 days back, not in year 0
    unset = jobs.parse_job("reconcile", {"job_id": "r", "account_id": ACCOUNT, "user_id": USER,
                                         "watermark": "0001-01-01T00:00:00Z"})
    assert isinstance(unset, jobs.ReconcileJob)
    assert unset.watermark is None
    with pytest.raises(ValidationError):  # a timestamp without a zone is a poison payload
        jobs.parse_job("reconcile", {"job_id": "r", "account_id": ACCOUNT, "user_id": USER,
                                     "watermark": "2026-07-20T12:00:00"})
    blob = jobs.parse_job("parse_blob", {"job_id": "reparse:s", "account_id": ACCOUNT, "user_id": USER,
                                         "ext_id": "9", "min_parser_version": 2,
                                         "blob": {"url": "https://s3/x", "fallback_handle": "users/u/strava/k"}})
    assert isinstance(blob, jobs.ParseBlobJob)
    assert blob.min_parser_version == "2.0"
    assert jobs.parser_refusal(blob, "1.4") == "dataset 2 is not ours (1)"
    blob.min_parser_version = "1.5"
    assert "above ours" in (jobs.parser_refusal(blob, "1.4") or "")
    blob.min_parser_version = "1.4"
    assert jobs.parser_refusal(blob, "1.4") is None
    with pytest.raises(ValidationError):
        jobs.parse_job("import_metrics", {"account_id": ACCOUNT, "user_id": USER, "since_unix": 1})
    gear = jobs.parse_job("import_gear", {"job_id": "g", "account_id": ACCOUNT, "user_id": USER})
    assert isinstance(gear, jobs.ImportGearJob) and gear.reason == ""
    backfill = jobs.parse_job("backfill", {"job_id": "b", "account_id": ACCOUNT, "user_id": USER,
                                           "athlete_id": 42, "since": "2026-01-01T00:00:00Z", "page_size": 500})
    assert isinstance(backfill, jobs.BackfillJob)
    assert backfill.page_size == 100 and backfill.since is not None
    small = jobs.parse_job("backfill", {"account_id": ACCOUNT, "user_id": USER, "page_size": 50})
    assert isinstance(small, jobs.BackfillJob) and small.page_size == 50


# --------------------------------------------------------------------------- request/reply + records

def test_reply_models_and_secret_repr() -> None:
    token = jobs.TokenReply.model_validate({"access_token": "at-SECRET", "client_secret": "cs-SECRET",
                                            "expires_at": "0001-01-01T00:00:00Z", "error": "account_gone"})
    assert token.expires_at is None and token.error == "account_gone"
    assert "SECRET" not in repr(token)
    req = jobs.OAuthExchangeRequest.model_validate({"connection_id": "c", "client_id": "id",
                                                    "client_secret": "cs-SECRET", "code": "code-SECRET",
                                                    "redirect_uri": "https://x/cb", "extra": 1})
    assert "SECRET" not in repr(req)
    reply = OAuthTokens(access_token="a", expires_at=datetime(2026, 1, 1, tzinfo=UTC),
                                    provider_account_id="42").to_wire()
    assert reply["expires_at"] == "2026-01-01T00:00:00Z" and reply["token_type"] == "Bearer"
    assert DiscoverRequest.model_validate({"account_id": ACCOUNT, "start_page": 0}).start_page == 1
    assert DiscoverReply.failed("rate_limited: budget").to_wire() == {"error": "rate_limited: budget"}
    with pytest.raises(ValidationError):
        jobs.PresignUploadRequest(provider="strava", content_type="application/json", content_length=1,
                                  content_sha256="NOT-HEX")
    up = jobs.PresignUploadReply.model_validate({"url": "https://s3/x?X-Amz-Signature=SIG", "blob_id": "k",
                                                 "expires_at": "2026-07-20T12:15:00.123Z",
                                                 "required_headers": {"Content-Type": "application/json"}})
    assert "SIG" not in repr(up)
    creds = jobs.CredsReply.model_validate({"email": "me@example.com", "password": "pw"})
    assert creds.login == ("me@example.com", "pw")


def test_presence_and_manifest_records_validate() -> None:
    now = datetime.now(UTC)
    record = jobs.PresenceRecord(worker_name="strava-fetcher", worker_key="strava-fetcher-strava",
                                 instance_id="h-1-abc", version="1.0", release="v0.7.0", provider="strava",
                                 package="p", capabilities={"Activity": {"read": True}}, last_seen=now).to_wire()
    assert record["last_seen"].endswith("Z") and record["capabilities"]["Activity"]["write"] is False
    with pytest.raises(ValidationError):
        jobs.PresenceRecord.model_validate({**record, "version": "1"})  # parser version is N.M
    meta: dict[str, Any] = {"display_name": "Strava", "auth_method": "oauth2",
            "oauth": {"authorize_url": "https://www.strava.com/oauth/authorize", "scopes": ["read"]},
            "config_fields": [{"key": "client_id", "label": "Client ID"}]}
    manifest = {"worker_name": "w", "version": "1.0", "provider": "strava", "package": "p",
                "updated_at": now, "provider_meta": meta}
    assert jobs.ManifestRecord.model_validate(manifest).to_wire()["provider_meta"]["auth_method"] == "oauth2"
    local = {**meta, "oauth": {**meta["oauth"], "authorize_url": "http://127.0.0.1:9/oauth"}}
    jobs.ManifestRecord.model_validate({**manifest, "provider_meta": local})
    for bad in ({**meta, "oauth": {**meta["oauth"], "authorize_url": "http://strava.example/o"}},
                {**meta, "oauth": None},
                {**meta, "config_fields": [{"key": "api_key", "label": "x"}]}):
        with pytest.raises(ValidationError):
            jobs.ManifestRecord.model_validate({**manifest, "provider_meta": bad})


# --------------------------------------------------------------------------- settings + subjects

def test_settings_env_versions_and_secret_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_WORKER_ENROLLMENT_TOKEN", "enroll-SECRET-123")
    monkeypatch.setenv("CAIRN_WORKER_NAME", "strava-api")
    monkeypatch.setenv("CAIRN_ACK_WAIT_S", "12.5")
    monkeypatch.setenv("CAIRN_LEASE_TTL_S", "4")
    monkeypatch.setenv("CAIRN_SHUTDOWN_GRACE_S", "7.5")
    settings = load_cairn_settings()
    assert settings.worker_name == "strava-api" and settings.ack_wait_s == 12.5
    assert settings.lease_ttl_s == 4.0 and settings.shutdown_grace_s == 7.5
    assert settings.worker_key == "strava-api-strava"
    assert StravaSettings().base_url == "https://www.strava.com"  # CAIRN_STRAVA_BASE_URL, read by the provider
    assert settings.max_deliver == -1 and settings.term_after_deliveries == 5  # unlimited, as Strava's
    assert "enroll-SECRET-123" not in repr(settings)
    assert "enroll-SECRET-123" not in redact("token enroll-SECRET-123 leaked")
    assert WORKER_VERSION.startswith("v0.7.") and PARSER_VERSION.count(".") == 1
    host, pid, rand = settings.instance_id.rsplit("-", 2)
    assert host and pid.isdigit() and len(rand) == 6
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "t=%s", ("enroll-SECRET-123",), None)
    RedactingFilter().filter(record)
    assert "enroll-SECRET-123" not in record.getMessage()


@pytest.mark.parametrize(("var", "value"), [("CAIRN_WORKER_NAME", "Bad Name"), ("CAIRN_NATS_URL", "http://x"),
                                            ("CAIRN_RELEASE", "0.7"), ("CAIRN_STRAVA_BASE_URL", "ftp://x"),
                                            ("CAIRN_LEASE_TTL_S", "0"), ("CAIRN_SHUTDOWN_GRACE_S", "-1")])
def test_settings_errors_name_the_variable(monkeypatch: pytest.MonkeyPatch, var: str, value: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=var):
        settings = load_cairn_settings()
        get_provider(settings.provider, settings)  # a provider reads its own CAIRN_<NAME>_* variables


def test_subjects_and_message_ids() -> None:
    assert subjects.job_subject("fetch_source", "strava", "pool") == "cairn.jobs.fetch_source.strava.pool"
    assert subjects.result_subject("parse_blob", "strava", "pool") == "cairn.results.parse_blob.strava.pool"
    assert subjects.reconcile_result_subject("strava", ACCOUNT) == f"cairn.results.reconcile.strava.{ACCOUNT}"
    assert subjects.discover_subject("strava", "pool") == "cairn.discover.strava.pool"
    assert subjects.oauth_exchange_subject("strava", "pool") == "cairn.oauth.strava.pool.exchange"
    assert subjects.account_lookup_subject("strava", "pool") == "cairn.accounts.lookup.strava.pool"
    assert subjects.presign_upload_subject("strava") == "cairn.blobs.presign_upload.strava"
    assert subjects.token_subject("strava", "get") == "cairn.tokens.strava.get"
    assert subjects.creds_subject("garmin") == "cairn.creds.garmin.get"
    assert subjects.presence_key("pool", "i1") == "pool.i1"
    assert subjects.rate_limit_key("strava", "app9", "short") == "strava.app9.short"
    assert subjects.activity_result_msg_id("j", 3) == "result:j:d3"
    assert subjects.result_msg_id("j") == "result:j"
    assert subjects.reconcile_subjob_msg_id("strava", ACCOUNT, "7") == f"reconcile:strava:{ACCOUNT}:7"
    kinds = {subjects.durable_name("pool", k) for k in subjects.JOB_KINDS}
    assert len(kinds) == len(subjects.JOB_KINDS) and all("." not in d for d in kinds)
    assert (subjects.PRESENCE_BUCKET, subjects.MANIFEST_BUCKET, subjects.RATE_LIMIT_BUCKET, subjects.CORE_BUCKET) == (
        "cairn_worker_presence", "cairn_worker_manifests", "cairn_rate_limits", "cairn_core")


def test_messages_module_is_reexported() -> None:
    assert jobs.PresenceRecord is messages.PresenceRecord
