"""The dev Voicy Worker API behaves like the real server (reference/voicy.md §1-§5, Appendix).

These drive the server over real HTTP on loopback with plain httpx, as
Voicy's own ``scripts/worker-api-proof.js`` does, so they prove the double and
not our client.
"""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from bson import ObjectId

from devstack.fakes.voicy_api import DevVoicyServer, DuplicateClientError
from devstack.fakes.voicy_api.store import now

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
STALE_S = 30 * 60  # a heartbeat 30 minutes old against the 15-minute default cutoff


class Worker:
    """A bare HTTP worker: one token, raw responses."""

    def __init__(self, server: DevVoicyServer, token: str) -> None:
        self.http = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=5)

    def close(self) -> None:
        self.http.close()

    def post(self, path: str, body: Any = None) -> httpx.Response:
        return self.http.post(path, json=body) if body is not None else self.http.post(path)

    def get(self, path: str) -> httpx.Response:
        return self.http.get(path)

    def to_ready(self, job_id: str | None = None, path: str = "/work/x.ogg") -> dict[str, Any]:
        job = self.post("/jobs/claim-download").json()["job"]
        assert job_id is None or job["id"] == job_id
        return self.post(f"/jobs/{job['id']}/downloaded", {"localSourcePath": path}).json()["job"]

    def to_transcribing(self, job_id: str | None = None) -> dict[str, Any]:
        job = self.to_ready(job_id)
        return self.post(f"/jobs/{job['id']}/transcribe").json()["job"]


@pytest.fixture()
def server() -> Iterator[DevVoicyServer]:
    with DevVoicyServer(env={"VOICY_PROGRESS_EDIT_INTERVAL_MS": "1000"}) as srv:
        yield srv


@pytest.fixture()
def a(server: DevVoicyServer) -> Iterator[Worker]:
    worker = Worker(server, server.create_client("worker-a"))
    yield worker
    worker.close()


@pytest.fixture()
def b(server: DevVoicyServer) -> Iterator[Worker]:
    worker = Worker(server, server.create_client("worker-b"))
    yield worker
    worker.close()


def test_auth_is_strict_bearer_against_enabled_sha256_hashes(server: DevVoicyServer) -> None:
    token = server.create_client("auth")
    assert token.startswith("voicy_worker_") and len(token) == 56
    stored = server.db.workerclients.find_one({"name": "auth"})
    assert stored["tokenHash"] == hashlib.sha256(token.encode()).hexdigest() and stored["enabled"] is True
    assert token not in repr(stored)
    with pytest.raises(DuplicateClientError):
        server.create_client("auth")
    url = server.url + "/jobs/claim-download"
    for header in (None, f"bearer {token}", f"Bearer  {token}", "Bearer", f"Token {token}"):
        r = httpx.post(url, headers={"Authorization": header} if header else {})
        assert (r.status_code, r.json()) == (401, {"error": "missing_worker_token"}), header
    r = httpx.post(url, headers={"Authorization": "Bearer not-a-known-token"})
    assert (r.status_code, r.json()) == (401, {"error": "invalid_worker_token"})
    assert httpx.post(url, headers={"Authorization": f"Bearer {token}"}).status_code == 204
    assert server.db.workerclients.find_one({"name": "auth"})["lastSeenAt"] is not None
    server.disable_client("auth")
    r = httpx.post(url, headers={"Authorization": f"Bearer {token}"})
    assert (r.status_code, r.json()) == (401, {"error": "invalid_worker_token"})
    # unknown paths need auth first, then answer Express's HTML 404
    assert httpx.put(server.url + "/nope").status_code == 401
    assert [r["status"] for r in server.requests][-1] == 401


def test_body_is_parsed_before_auth_and_ids_before_bodies(server: DevVoicyServer, a: Worker) -> None:
    r = httpx.post(server.url + "/jobs/claim-download", content=b"{bad",
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "text/html" in r.headers["content-type"]
    r = a.http.post("/jobs/claim-download", content=b"x" * (1_048_577),
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert (a.get("/jobs/claim").status_code, a.get("/jobs/claim").json()) == (400, {"error": "invalid_job_id"})
    assert a.post("/jobs/not-an-id/downloaded", {"localSourcePath": 5}).json() == {"error": "invalid_job_id"}
    twelve = a.post("/jobs/abcdefghijkl/heartbeat")  # a 12-byte string is a valid ObjectId
    assert (twelve.status_code, twelve.json()) == (404, {"error": "job_not_found"})
    assert a.post("/jobs/" + "0" * 24).status_code == 404  # no such route: HTML 404
    assert a.post("/JOBS/CLAIM-DOWNLOAD/").status_code == 204  # case-insensitive, trailing slash


def test_exactly_one_of_two_clients_claims_a_single_job(server: DevVoicyServer, a: Worker, b: Worker) -> None:
    job_id = server.enqueue_job("AwAC-race", file_size=1234)
    results: list[httpx.Response] = []
    barrier = threading.Barrier(2)

    def claim(w: Worker) -> None:
        barrier.wait()
        results.append(w.post("/jobs/claim-download"))

    threads = [threading.Thread(target=claim, args=(w,)) for w in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in results) == [200, 204]
    job = next(r for r in results if r.status_code == 200).json()["job"]
    assert job["id"] == job_id and job["status"] == "downloading" and job["attempts"] == 1
    assert job["fileId"] == "AwAC-race" and job["fileSize"] == 1234
    assert "workerId" not in job and "sourceUrl" not in job  # hidden / never set
    stored = server.get_job(job_id)
    assert stored["workerId"] and stored["claimedAt"] == stored["heartbeatAt"]
    winner = server.db.workerclients.find_one({"_id": ObjectId(stored["workerId"])})
    assert winner["lastClaimedAt"] == stored["claimedAt"]
    assert next(r for r in results if r.status_code == 204).content == b""


def test_non_owner_is_404_everywhere(server: DevVoicyServer, a: Worker, b: Worker) -> None:
    job_id = server.enqueue_job("AwAC-own")
    a.post("/jobs/claim-download")
    for path in ("heartbeat", "transcribe", "failure", "result", "progress"):
        r = b.post(f"/jobs/{job_id}/{path}", {"text": "x"})
        assert (r.status_code, r.json()) == (404, {"error": "job_not_found"}), path
    assert b.get(f"/jobs/{job_id}").status_code == 404
    assert b.get(f"/jobs/{job_id}/source").status_code == 404
    assert a.post(f"/jobs/{job_id}/heartbeat").json()["job"]["status"] == "downloading"


def test_downloaded_then_ready_then_transcribe(server: DevVoicyServer, a: Worker) -> None:
    job_id = server.enqueue_job("AwAC-flow", file_path="voice/file_1.oga", file_size=99)
    a.post("/jobs/claim-download")
    src = a.get(f"/jobs/{job_id}/source").json()["source"]
    assert src == {"jobId": job_id, "fileId": "AwAC-flow", "filePath": "voice/file_1.oga", "fileSize": 99,
                   "mimeType": "audio/ogg", "sourceKind": "voice"}
    assert a.post(f"/jobs/{job_id}/transcribe").status_code == 404  # not ready yet
    assert a.post(f"/jobs/{job_id}/downloaded", {"localSourcePath": 7}).json() == \
        {"error": "invalid_local_source_path"}
    assert a.post(f"/jobs/{job_id}/downloaded", {"localSourcePath": "  "}).json() == \
        {"error": "local_source_path_required"}
    job = a.post(f"/jobs/{job_id}/downloaded", {"localSourcePath": " /w/a.ogg"}).json()["job"]
    assert job["status"] == "ready" and job["localSourcePath"] == " /w/a.ogg" and job["downloadedAt"]
    assert a.post(f"/jobs/{job_id}/downloaded", {"localSourcePath": "/w/a.ogg"}).status_code == 404
    assert a.post(f"/jobs/{job_id}/progress", {"text": "early"}).status_code == 404  # progress on ready
    job = a.post(f"/jobs/{job_id}/transcribe").json()["job"]
    assert job["status"] == "transcribing"
    assert a.post(f"/jobs/{job_id}/transcribe").status_code == 404  # not idempotent
    assert [e["phase"] for e in server.edits] == ["processing"]


def test_progress_is_stored_every_time_but_edits_are_throttled(server: DevVoicyServer, a: Worker) -> None:
    job_id = a.to_transcribing(server.enqueue_job("AwAC-prog"))["id"]
    assert a.post(f"/jobs/{job_id}/progress", {"text": "  "}).json() == {"error": "progress_text_required"}
    assert a.post(f"/jobs/{job_id}/progress", {"text": None}).json() == {"error": "invalid_progress_text"}
    assert a.post(f"/jobs/{job_id}/progress", {"parts": [{}]}).json() == {"error": "invalid_result_part_text"}
    assert a.post(f"/jobs/{job_id}/progress", {"parts": [1]}).json() == {"error": "invalid_result_part"}
    assert a.post(f"/jobs/{job_id}/progress", {"text": "x", "duration": -1}).json() == {"error": "invalid_duration"}
    assert a.post(f"/jobs/{job_id}/progress", {"text": "x", "metadata": []}).json() == \
        {"error": "invalid_engine_metadata"}
    first = a.post(f"/jobs/{job_id}/progress", {"text": "one", "parts": [{"timeCode": "00:00", "text": "one",
                                                                          "extra": 1}],
                                                "language": "en", "engine": "faster-whisper", "duration": 1.5})
    assert first.status_code == 200 and first.json()["job"]["lastProgressPublishedAt"]
    second = a.post(f"/jobs/{job_id}/progress", {"text": "one two"})  # within 1000 ms: stored, no edit
    assert second.json()["job"]["partialResultText"] == "one two"
    stored = server.get_job(job_id)
    assert stored["partialResultParts"] == [{"timeCode": "00:00", "text": "one"}]  # kept, normalized
    assert stored["recognitionLanguage"] == "en" and stored["duration"] == 1.5 and stored["lastProgressAt"]
    assert [e["phase"] for e in server.edits].count("partial") == 1
    server.advance_clock(1.0)  # exactly at the interval boundary an edit is allowed
    a.post(f"/jobs/{job_id}/progress", {"text": "one two three", "parts": [{"text": "one two three"}]})
    partial = [e for e in server.edits if e["phase"] == "partial"]
    assert [e["text"] for e in partial] == ["one", "one two three"]
    assert len(server.requests_for("progress", job_id)) == 9


def test_channel_jobs_get_no_live_edits(server: DevVoicyServer, a: Worker) -> None:
    job_id = a.to_transcribing(server.enqueue_job("AwAC-chan", chat_type="channel"))["id"]
    assert a.post(f"/jobs/{job_id}/progress", {"text": "draft"}).status_code == 200
    assert server.get_job(job_id)["partialResultText"] == "draft" and server.edits == []


def test_result_completes_and_persists_transcript(server: DevVoicyServer, a: Worker) -> None:
    job_id = a.to_transcribing(server.enqueue_job("AwAC-res"))["id"]
    a.post(f"/jobs/{job_id}/progress", {"text": "partial"})
    assert a.post(f"/jobs/{job_id}/result", {"parts": []}).json() == {"error": "result_text_required"}
    body = {"text": "Final transcript", "parts": [{"timeCode": "00:00", "text": "Final transcript"}],
            "language": "en", "engine": "faster-whisper", "duration": 3.2, "metadata": {"model": "tiny.en"}}
    r = a.post(f"/jobs/{job_id}/result", body)
    assert r.status_code == 200 and r.json()["job"]["status"] == "completed"
    job = server.get_job(job_id)
    assert job["resultText"] == "Final transcript" and job["resultParts"] == body["parts"]
    assert job["workerEngineMetadata"] == {"model": "tiny.en"} and job["completedAt"]
    assert job["partialResultText"] == "partial" and "activeMediaCacheKey" not in job
    voice = server.db.voices.find_one({"chatId": job["chatId"], "messageId": job["sourceMessageId"]})
    assert voice["text"] == "Final transcript" and voice["url"] == "/work/x.ogg"
    assert voice["textWithTimecodes"] == [["00:00", "Final transcript"]] and voice["language"] == "en"
    assert server.db.transcriptionresultcaches.find_one({"cacheKey": job["mediaCacheKey"]})["resultText"]
    assert [e["text"] for e in server.edits if e["phase"] == "completed"] == ["Final transcript"]
    assert a.post(f"/jobs/{job_id}/result", body).status_code == 404  # second result


# How long the handler below holds still after the job is completed, waiting for a reader to look.
HOLD_S = 0.5


def test_a_completed_job_is_never_seen_before_its_results_answer(server: DevVoicyServer, a: Worker,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A test reads the store from its own thread while the server handles ``/result`` on another: the
    job must not read completed while the request that completed it has no status yet, or a check of
    "one result accepted" counts none. The handler is stopped right after the store's change, and a
    reader looks then."""
    job_id = a.to_transcribing(server.enqueue_job("AwAC-seen"))["id"]
    changed, read = threading.Event(), threading.Event()
    update_job = server.state.store.update_job

    def holding(flt: dict[str, Any], update: dict[str, Any], *args: Any, **kw: Any) -> dict[str, Any] | None:
        after = update_job(flt, update, *args, **kw)
        if update.get("$set", {}).get("status") == "completed":
            changed.set()
            read.wait(HOLD_S)  # a reader held off by the server waits out this hold
        return after

    monkeypatch.setattr(server.state.store, "update_job", holding)
    seen: list[tuple[str, list[int]]] = []

    def reader() -> None:
        changed.wait(5)
        seen.append((server.get_job(job_id)["status"],
                     [r["status"] for r in server.requests if r["path"].endswith(f"/jobs/{job_id}/result")]))
        read.set()

    looker = threading.Thread(target=reader)
    looker.start()
    assert a.post(f"/jobs/{job_id}/result", {"text": "seen"}).status_code == 200
    looker.join(5)
    assert seen == [("completed", [200])]


def test_a_request_is_never_seen_before_its_body(server: DevVoicyServer, a: Worker) -> None:
    """A worker's body can arrive after its headers. A test that waits for a ``/failure`` request and
    then reads its ``json`` must find the body there, never a half-recorded request."""
    job_id = a.to_transcribing(server.enqueue_job("AwAC-slow-body"))["id"]
    body = json.dumps({"error": "slow body", "retryable": False}).encode()
    host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
    token = a.http.headers["Authorization"]
    with socket.create_connection((host.strip("[]"), int(port)), timeout=5) as raw:
        raw.sendall(f"POST /worker/v1/jobs/{job_id}/failure HTTP/1.1\r\nHost: {host}\r\n"
                    f"Authorization: {token}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body[:10])
        # a whole request sent after those headers is handled while the first body is still awaited
        assert a.post("/jobs/claim-download").status_code == 204
        assert [r["json"] for r in server.requests if r["path"].endswith("/failure")] == []
        raw.sendall(body[10:])
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
    assert [r["json"] for r in server.requests if r["path"].endswith("/failure")] == [
        {"error": "slow body", "retryable": False}]


def test_empty_result_is_a_result(server: DevVoicyServer, a: Worker) -> None:
    job_id = a.to_transcribing(server.enqueue_job("AwAC-empty"))["id"]
    assert a.post(f"/jobs/{job_id}/result", {"text": ""}).json()["job"]["status"] == "completed"
    assert server.edits[-1]["text"] == "Done, but no text was detected."


def test_publish_failure_is_500_and_leaves_the_job_transcribing(server: DevVoicyServer, a: Worker) -> None:
    job_id = a.to_transcribing(server.enqueue_job("AwAC-pub"))["id"]
    server.inject_failure("publish", status=500, times=1)
    r = a.post(f"/jobs/{job_id}/result", {"text": "kept"})
    assert (r.status_code, r.json()) == (500, {"error": "worker_api_error"})
    assert server.get_job(job_id)["status"] == "transcribing" and server.get_job(job_id)["resultText"] == "kept"
    assert a.post(f"/jobs/{job_id}/result", {"text": "kept"}).json()["job"]["status"] == "completed"


def test_retryable_failure_requeues_while_attempts_remain(server: DevVoicyServer, a: Worker) -> None:
    job_id = server.enqueue_job("AwAC-retry")
    for attempt in (1, 2):
        assert a.to_ready(job_id)["attempts"] == attempt
        r = a.post(f"/jobs/{job_id}/failure", {"error": "download timed out", "retryable": "false"})
        job = r.json()["job"]  # the string "false" is truthy in JavaScript
        assert job["status"] == "queued_for_download" and job["attempts"] == attempt
        stored = server.get_job(job_id)
        assert stored["lastError"] == "download timed out"
        assert not {"workerId", "claimedAt", "heartbeatAt", "localSourcePath", "downloadedAt"} & set(stored)
    a.to_ready(job_id)  # third claim: attempts == 3 == max
    job = a.post(f"/jobs/{job_id}/failure", {"error": "x" * 3000}).json()["job"]
    assert job["status"] == "failed"
    stored = server.get_job(job_id)
    assert len(stored["lastError"]) == 2000 and stored["failedAt"] and "activeMediaCacheKey" not in stored
    assert a.post(f"/jobs/{job_id}/failure", {}).status_code == 404
    assert [e["phase"] for e in server.edits] == ["retrying", "retrying", "failed"]  # forced past the throttle


def test_non_retryable_failure_fails_at_once_and_max_attempts_is_configurable(server: DevVoicyServer,
                                                                            a: Worker) -> None:
    job_id = server.enqueue_job("AwAC-perm")
    a.post("/jobs/claim-download")
    assert a.post(f"/jobs/{job_id}/failure", {"error": "bad", "retryable": False}).json()["job"]["status"] == \
        "failed"
    server.env["VOICY_WORKER_MAX_ATTEMPTS"] = "1"
    other = server.enqueue_job("AwAC-once")
    a.post("/jobs/claim-download")
    assert a.post(f"/jobs/{other}/failure", {"error": "t"}).json()["job"]["status"] == "failed"


def test_claim_ready_recovers_ready_and_stale_own_jobs(server: DevVoicyServer, a: Worker, b: Worker) -> None:
    assert a.post("/jobs/claim-ready").status_code == 204
    ready = a.to_ready(server.enqueue_job("AwAC-ready"))["id"]
    assert b.post("/jobs/claim-ready").status_code == 204  # never another worker's job
    job = a.post("/jobs/claim-ready", {"bucket": "oldest"}).json()["job"]
    assert job["id"] == ready and job["status"] == "transcribing" and job["attempts"] == 1
    assert a.post("/jobs/claim-ready").status_code == 204  # fresh heartbeat: not stale
    server.advance_clock(STALE_S)
    job = a.post("/jobs/claim-ready").json()["job"]
    assert job["id"] == ready and job["attempts"] == 1 and job["localSourcePath"] == "/work/x.ogg"
    # a downloading job is never reclaimed, however stale
    stuck = server.enqueue_job("AwAC-stuck")
    a.post("/jobs/claim-download")
    server.update_job(stuck, {"heartbeatAt": now() - timedelta(hours=2)})
    assert a.post("/jobs/claim-ready").status_code == 204
    # the record of each claim names the job it took, if any
    assert [r.get("claimed") for r in server.requests_for("claim-ready")] == [None, None, ready, None, ready, None]


def test_stale_cutoff_is_configurable_and_uses_claimed_at_without_heartbeat(server: DevVoicyServer,
                                                                          a: Worker) -> None:
    server.env["VOICY_WORKER_STALE_ACTIVE_JOB_MS"] = "60000"
    job_id = a.to_transcribing(server.enqueue_job("AwAC-cut"))["id"]
    server.update_job(job_id, {"heartbeatAt": now() - timedelta(seconds=30)})
    assert a.post("/jobs/claim-ready").status_code == 204
    server.db.transcriptionjobs.update_one({"fileId": "AwAC-cut"}, {"$unset": {"heartbeatAt": ""},
                                                                   "$set": {"claimedAt": now() - timedelta(
                                                                       seconds=90)}})
    assert a.post("/jobs/claim-ready").json()["job"]["id"] == job_id


def test_buckets_choose_oldest_or_newest(server: DevVoicyServer, a: Worker) -> None:
    ids = [server.enqueue_job(f"AwAC-b{n}") for n in range(4)]
    assert a.post("/jobs/claim-download", {"bucket": "newest"}).json()["job"]["id"] == ids[3]
    assert a.post("/jobs/claim-download", {"bucket": "bogus"}).json()["job"]["id"] == ids[0]
    assert a.post("/jobs/claim-download", {"bucket": "oldest"}).json()["job"]["id"] == ids[1]
    assert a.post("/jobs/claim-download").json()["job"]["id"] == ids[2]
    assert a.post("/jobs/claim-download", {"bucket": "newest"}).status_code == 204
    for job_id in (ids[1], ids[3], ids[0]):  # download order decides claim-ready order
        a.post(f"/jobs/{job_id}/downloaded", {"localSourcePath": f"/w/{job_id}"})
    assert a.post("/jobs/claim-ready", {"bucket": "newest"}).json()["job"]["id"] == ids[0]
    assert a.post("/jobs/claim-ready", {"bucket": "oldest"}).json()["job"]["id"] == ids[1]
    buckets = [r["bucket"] for r in server.requests_for("claim-download")]
    assert buckets == ["newest", "oldest", "oldest", "oldest", "newest"]
    assert [r["status"] for r in server.requests_for("claim-download")] == [200, 200, 200, 200, 204]


def test_legacy_claim_prefers_ready_then_queued_with_source_url(server: DevVoicyServer, a: Worker) -> None:
    token_url = "https://api.telegram.org/file/bot123456:AAbbCC_dd-ee/voice/file_9.oga"
    ready = a.to_ready(server.enqueue_job("AwAC-first"))["id"]
    legacy = server.enqueue_job("AwAC-legacy", status="queued", source_url=token_url)
    assert a.post("/jobs/claim", {"bucket": "newest"}).json()["job"]["id"] == ready  # ready branch first
    job = a.post("/jobs/claim").json()["job"]
    assert job["id"] == legacy and job["status"] == "processing" and job["attempts"] == 1
    shown = a.get(f"/jobs/{legacy}").json()["job"]
    assert "sourceUrl" not in shown and "sourceUrl" not in a.get(f"/jobs/{legacy}/source").json()["source"]
    assert a.post(f"/jobs/{legacy}/progress", {"text": "legacy ok"}).status_code == 200
    assert a.post("/jobs/claim").status_code == 204
    safe = server.enqueue_job("AwAC-safe", status="queued", source_url="https://example.invalid/proof.ogg")
    assert a.post("/jobs/claim-download").json()["job"]["sourceUrl"] == "https://example.invalid/proof.ogg"
    assert a.post(f"/jobs/{safe}/failure", {"error": "x"}).json()["job"]["status"] == "queued_for_download"


def test_fault_injection_answers_n_times_then_recovers(server: DevVoicyServer, a: Worker) -> None:
    server.inject_failure("claim-download", status=503, times=2)
    codes = [a.post("/jobs/claim-download").status_code for _ in range(3)]
    assert codes == [503, 503, 204]
    assert a.post("/jobs/claim-download").status_code == 204
    job_id = a.to_transcribing(server.enqueue_job("AwAC-fault"))["id"]
    server.inject_failure("result", status=503, times=1)
    r = a.post(f"/jobs/{job_id}/result", {"text": "t"})
    assert (r.status_code, r.json()) == (503, {"error": "worker_api_error"})
    assert server.get_job(job_id)["status"] == "transcribing"  # the fault hit before the handler
    assert a.post(f"/jobs/{job_id}/result", {"text": "t"}).status_code == 200
    assert [r["status"] for r in server.requests_for("result", job_id)] == [503, 200]


def test_cli_seeds_a_running_server_over_the_dev_endpoints(server: DevVoicyServer) -> None:
    def cli(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "devstack.fakes.voicy_api", *args, "--server",
                               server.base_url], check=True, capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin"}, cwd=ROOT, timeout=30).stdout

    out = cli("create-client", "cli-worker").splitlines()
    assert out[0] == "Worker client created: cli-worker" and out[2].startswith("Store this token now")
    token = out[1].removeprefix("Token: ")
    job_id = cli("enqueue", "--file-id", "AwAC-cli", "--file-size", "10").strip()
    w = Worker(server, token)
    job = w.post("/jobs/claim-download").json()["job"]
    w.close()
    assert job["id"] == job_id and job["fileSize"] == 10
