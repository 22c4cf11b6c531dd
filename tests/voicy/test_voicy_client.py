"""VoicyClient against the dev Voicy Worker API on loopback (reference/voicy.md §1, §6.2, §6.8, §6.9)."""

from __future__ import annotations

import socket
import traceback
from collections.abc import Iterator
from typing import TypedDict

import pytest

from devstack.fakes.voicy_api import DevVoicyServer
from workers.errors import AuthError, PermanentJobError, RetryableJobError, StaleJobError
from workers.logs import register_secret
from workers.voicy.client import AUTH_MESSAGE, VoicyApiError, VoicyClient
from workers.voicy.models import (
    MAX_PARTS,
    MAX_TEXT_CHARS,
    EngineMetadata,
    FailureBody,
    Part,
    TranscriptBody,
    redact_sensitive_text,
)

TOKEN = "voicy_worker_CLIENT-test-SECRET-d41d8cd98f00b204"


class _Retry(TypedDict):  # VoicyClient's retry keywords, typed for ``**FAST_RETRY``
    retry_attempts: int
    retry_budget_s: float


FAST_RETRY: _Retry = {"retry_attempts": 3, "retry_budget_s": 5.0}


@pytest.fixture(scope="module")
def server() -> Iterator[DevVoicyServer]:
    with DevVoicyServer() as srv:
        srv.create_client("client-tests", token=TOKEN)
        yield srv


@pytest.fixture()
def client(server: DevVoicyServer) -> Iterator[VoicyClient]:
    with VoicyClient(server.url, TOKEN, timeout_s=5, **FAST_RETRY) as c:
        yield c


def _drain(client: VoicyClient) -> None:
    """Claim and fail whatever another test left queued, so each test starts from an empty queue."""
    while (job := client.claim_download("oldest")) is not None:
        client.failure(job.id, "drain", retryable=False)


def _transcribing(server: DevVoicyServer, client: VoicyClient, file_id: str, local_path: str) -> str:
    """A fresh job of this client, claimed, downloaded and now ``transcribing``: ready for a result."""
    _drain(client)
    job_id = server.enqueue_job(file_id)
    client.claim_download("oldest")
    client.downloaded(job_id, local_path)
    client.transcribe(job_id)
    return job_id


def _body(text: str = "hello there", **kw: object) -> TranscriptBody:
    return TranscriptBody(text=text, parts=[Part(time_code="00:00", text=text)], language="en",
                          duration=1.5, metadata=EngineMetadata(model="tiny.en", device="cpu",
                                                                compute_type="int8"), **kw)


def test_full_lifecycle_and_no_nulls_on_the_wire(server: DevVoicyServer, client: VoicyClient,
                                                 http_logs: pytest.LogCaptureFixture) -> None:
    _drain(client)
    assert client.claim_download("oldest") is None  # 204
    job_id = server.enqueue_job("AwAC-life", file_path="voice/file_9.oga", file_size=17, language="en")
    job = client.claim_download("oldest")
    assert job is not None and job.id == job_id
    assert (job.status, job.attempts, job.file_id, job.recognition_language_hint) == \
        ("downloading", 1, "AwAC-life", "en")
    source = client.source(job_id)
    assert (source.job_id, source.file_id, source.file_path, source.file_size) == \
        (job_id, "AwAC-life", "voice/file_9.oga", 17)
    assert client.downloaded(job_id, "/srv/media/x.ogg").status == "ready"
    assert client.transcribe(job_id).status == "transcribing"
    assert client.heartbeat(job_id).status == "transcribing"
    partial = TranscriptBody(text="hello", duration=None, language=None)  # Nones must be omitted
    client.progress(job_id, partial)
    assert client.result(job_id, _body()).status == "completed"
    assert server.requests_for("progress", job_id)[-1]["json"] == {"text": "hello", "engine": "faster-whisper"}
    stored = server.get_job(job_id)
    assert stored["resultText"] == "hello there" and stored["workerEngine"] == "faster-whisper"
    assert stored["workerEngineMetadata"] == {"model": "tiny.en", "device": "cpu", "computeType": "int8"}
    assert stored["resultParts"] == [{"timeCode": "00:00", "text": "hello there"}]
    assert TOKEN not in http_logs.text
    assert "HTTP Request" in http_logs.text  # httpx really logged, so the check above means something


def test_empty_result_is_a_normal_result(server: DevVoicyServer, client: VoicyClient) -> None:
    job_id = _transcribing(server, client, "AwAC-empty", "/srv/media/e.ogg")
    assert client.result(job_id, TranscriptBody(text="", parts=[])).status == "completed"
    assert server.get_job(job_id)["resultText"] == ""


def test_buckets_claim_ready_and_legacy(server: DevVoicyServer, client: VoicyClient) -> None:
    _drain(client)
    older = server.enqueue_job("AwAC-old")
    newer = server.enqueue_job("AwAC-new")
    newest = client.claim_download("newest")
    assert newest is not None and newest.id == newer
    oldest = client.claim_download("oldest")
    assert oldest is not None and oldest.id == older
    assert client.claim_ready("oldest") is None  # 204: nothing downloaded yet
    client.downloaded(older, "/srv/media/old.ogg")
    ready = client.claim_ready("newest")
    assert ready is not None and ready.id == older and ready.status == "transcribing"
    assert ready.local_source_path == "/srv/media/old.ogg"
    server.inject_failure("claim-ready", status=404, error="not_a_route")  # an older server (§6.2)
    assert client.claim_ready("oldest") is None
    client.failure(newer, "done", retryable=False)
    client.failure(older, "done", retryable=False)
    legacy = server.enqueue_job("AwAC-legacy", status="queued", source_url="https://example.invalid/a.ogg")
    job = client.claim_legacy()
    assert job is not None and job.id == legacy and job.status == "processing"
    assert job.source_url == "https://example.invalid/a.ogg"  # not token-bearing: passed through
    client.failure(legacy, "done", retryable=False)
    assert client.claim_legacy() is None


def test_stale_jobs_and_other_4xx(server: DevVoicyServer, client: VoicyClient) -> None:
    _drain(client)
    job_id = server.enqueue_job("AwAC-stale")
    client.claim_download("oldest")
    with pytest.raises(StaleJobError):
        client.transcribe(job_id)  # not ready: 404 job_not_found
    other_token = server.create_client("client-tests-other")
    with VoicyClient(server.url, other_token, timeout_s=5) as other, pytest.raises(StaleJobError):
        other.heartbeat(job_id)  # another worker's job is 404 too, never 403
    with pytest.raises(VoicyApiError) as bad_id:
        client.get_job("not-an-id")
    assert (bad_id.value.status, bad_id.value.code) == (400, "invalid_job_id")
    assert not bad_id.value.retryable and isinstance(bad_id.value, PermanentJobError)
    with pytest.raises(VoicyApiError) as blank:
        client.downloaded(job_id, "   ")
    assert blank.value.code == "local_source_path_required"
    server.inject_failure("heartbeat", status=404, error="something_else")
    with pytest.raises(VoicyApiError):  # a 404 without a stale code is not stale (§6.2)
        client.heartbeat(job_id)
    client.failure(job_id, "done", retryable=False)


def test_transient_errors_are_retried_then_retryable(server: DevVoicyServer, client: VoicyClient) -> None:
    _drain(client)
    job_id = server.enqueue_job("AwAC-retry")
    client.claim_download("oldest")
    server.inject_failure("heartbeat", status=503, times=2)
    assert client.heartbeat(job_id).status == "downloading"  # retried past two 503s
    server.inject_failure("heartbeat", status=500, times=10)
    with pytest.raises(RetryableJobError, match="HTTP 500"):
        client.heartbeat(job_id)
    server.inject_failure("heartbeat", status=500, times=0)
    with socket.socket() as s:  # a port with nothing listening: connection refused
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/worker/v1"
    with VoicyClient(dead, TOKEN, timeout_s=1, retry_attempts=2) as gone, \
            pytest.raises(RetryableJobError, match="ConnectError") as info:
        gone.claim_download("oldest")
    assert TOKEN not in _everything(info.value)
    client.failure(job_id, "done", retryable=False)


def test_auth_errors_name_the_variable_not_the_token(server: DevVoicyServer,
                                                     http_logs: pytest.LogCaptureFixture) -> None:
    wrong = "voicy_worker_WRONG-SECRET-value-0123456789"
    with VoicyClient(server.url, wrong, timeout_s=5) as bad, pytest.raises(AuthError) as info:
        bad.claim_download("oldest")
    assert str(info.value) == AUTH_MESSAGE
    disabled = server.create_client("client-tests-disabled", token="voicy_worker_DISABLED-SECRET-42")
    server.disable_client("client-tests-disabled")
    with VoicyClient(server.url, disabled, timeout_s=5) as off, pytest.raises(AuthError):
        off.claim_ready("oldest")
    for secret in (wrong, disabled, TOKEN):
        assert secret not in http_logs.text and secret not in _everything(info.value)


def test_failure_text_is_redacted_and_flag_respected(server: DevVoicyServer, client: VoicyClient) -> None:
    _drain(client)
    registered = "my-registered-SECRET-abcdef"
    register_secret(registered)
    job_id = server.enqueue_job("AwAC-fail")
    client.claim_download("oldest")
    message = (f"GET https://api.telegram.org/file/bot123456:AAE-secret_Token-xyz/voice/a.oga failed; "
               f"with token 123456:ABCDEFGHIJKLMNOPQRSTUVWXYZabc; Bearer {TOKEN}; at /home/w/x.ogg; "
               f"{registered}")
    assert client.failure(job_id, message, retryable=True).status == "queued_for_download"
    last_error = server.get_job(job_id)["lastError"]
    for leaked in ("AAE-secret_Token-xyz", "ABCDEFGHIJKLMNOP", TOKEN, "/home/w", registered):
        assert leaked not in last_error
    assert "/file/bot[redacted-telegram-token]/voice/a.oga" in last_error
    assert "[redacted-local-path]" in last_error
    job = client.claim_download("oldest")
    assert job is not None and job.id == job_id and job.attempts == 2
    assert client.failure(job_id, "bad media", retryable=False).status == "failed"


def test_voicy_redaction_rules_in_order() -> None:
    # The exact form Voicy's proof asserts (§6.9): rule 2, then rule 3.
    assert redact_sensitive_text("with token 123456:ABCDEFGHIJKLMNOPQRSTUVWXYZabc") == "with [redacted-secret]"
    assert redact_sensitive_text("mongodb://u:pw@h/db") == "mongodb://u:[redacted-password]@h/db"
    assert redact_sensitive_text("see https://x/y?token=abc&z=1") == "see https://x/y?token=[redacted]&z=1"
    assert redact_sensitive_text("C:\\voicy\\jobs\\1.ogg missing") == "[redacted-local-path] missing"
    assert FailureBody(error="", retryable=True).error == "Unknown worker error"
    assert len(FailureBody(error="é" * 5000, retryable=True).error) == 2000
    assert len(FailureBody(error="😀" * 1500, retryable=True).error) == 1000  # 2000 UTF-16 units


def test_oversized_bodies_fail_permanently_before_sending(server: DevVoicyServer, client: VoicyClient) -> None:
    job_id = _transcribing(server, client, "AwAC-big", "/srv/media/big.ogg")
    before = len(server.requests_for("result", job_id))
    with pytest.raises(PermanentJobError, match="textChars=100001; maxTextChars=100000"):
        client.result(job_id, TranscriptBody(text="x" * (MAX_TEXT_CHARS + 1)))
    parts = [Part(time_code="00:00", text="a")] * (MAX_PARTS + 1)
    with pytest.raises(PermanentJobError, match="parts=5001; maxParts=5000"):
        client.result(job_id, TranscriptBody(text="a", parts=parts))
    assert len(server.requests_for("result", job_id)) == before  # nothing was sent
    client.failure(job_id, "done", retryable=False)


def test_client_from_settings_and_missing_token(server: DevVoicyServer) -> None:
    from workers.voicy.settings import VoicySettings

    settings = VoicySettings(api_url=server.url + "/", token=TOKEN, download_timeout_ms=5000)
    with VoicyClient(settings) as c:
        assert c.claim_ready("oldest") is None  # authenticated; every earlier job has ended
    with pytest.raises(AuthError):
        VoicyClient(server.url, "", timeout_s=1)


def _everything(exc: BaseException) -> str:
    """The exception as any log or traceback could render it, chained causes included."""
    return "".join(traceback.format_exception(exc)) + repr(exc) + repr(exc.args)
