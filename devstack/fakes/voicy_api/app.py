"""The dev Voicy Worker API: every ``/worker/v1`` endpoint as the real server behaves.

Status codes, error bodies, filters and updates follow reference/voicy.md §1-§5
and its test-double checklist: JSON parsed before auth (malformed -> HTML 400,
> 1 MiB -> HTML 413), strict ``Bearer``, ``lastSeenAt`` on every authenticated
request, ids validated before bodies, 404 ``job_not_found`` for every
ownership or state mismatch (never 403/409), omitted optional fields keep
their stored values, unknown routes are Express's HTML 404 after auth,
routing is case-insensitive and tolerates a trailing slash.

Handlers run on the event-loop thread and every store call is one
compare-and-set under the store's lock, so two racing claims get one 200 and
one 204 also on mongomock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from devstack.fakes.voicy_api.admin import AdminApi
from devstack.fakes.voicy_api.policy import Policy
from devstack.fakes.voicy_api.publish import Publisher, PublishError
from devstack.fakes.voicy_api.store import Store, now
from devstack.fakes.voicy_api.validate import (
    MAX_ERROR_UNITS,
    ApiError,
    iso,
    js_slice,
    js_truthy,
    object_id,
    progress_fields,
    result_fields,
)
from workers.voicy.telegram import is_token_bearing

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1_048_576  # express.json({limit: "1mb"})
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
ACTIVE4 = ["downloading", "ready", "transcribing", "processing"]
TRANSCRIBING = ["transcribing", "processing"]
NON_EMPTY = {"$exists": True, "$nin": ["", None]}
SERIALIZED = ["status", "chatId", "telegramChatId", "telegramChatType", "sourceMessageId",
              "statusMessageId", "requestMessageId", "fileId", "fileUniqueId", "filePath",
              "localSourcePath", "fileSize", "mimeType", "fileName", "sourceKind", "sourceUrl",
              "requestedByUserId", "forwardedFromUserId", "forwardedSenderName",
              "recognitionLanguageHint", "partialResultText", "lastProgressAt",
              "lastProgressPublishedAt", "attempts", "claimedAt", "downloadedAt", "heartbeatAt",
              "createdAt", "updatedAt"]
SOURCE_KEYS = ["fileId", "fileUniqueId", "filePath", "localSourcePath", "fileSize", "mimeType", "fileName",
               "sourceKind", "sourceUrl"]
CLAIMS = ("claim-download", "claim-ready", "claim")
POST_ACTIONS = ("downloaded", "transcribe", "heartbeat", "progress", "result", "failure")


def serialize(job: dict[str, Any]) -> dict[str, Any]:
    """``serializeJob``: Voicy's key order, absent keys omitted, token URLs suppressed (§1.0)."""
    out: dict[str, Any] = {"id": str(job["_id"])}
    for key in SERIALIZED:
        value = job.get(key)
        if value is None or (key == "sourceUrl" and is_token_bearing(str(value))):
            continue
        out[key] = iso(value)
    return out


@dataclass
class Fault:
    status: int
    times: int
    error: str = "worker_api_error"


@dataclass
class ServerState:
    store: Store
    policy: Policy = field(default_factory=Policy)
    requests: list[dict[str, Any]] = field(default_factory=list)
    faults: dict[str, Fault] = field(default_factory=dict)
    delays: dict[str, float] = field(default_factory=dict)  # endpoint → seconds every answer is held
    clock_offset: timedelta = timedelta(0)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Held while a handler changes the store and its request's record takes the answer's status, and by
    # the readers of the store and the records (``DevVoicyServer``): a reader never sees a request's
    # effect (a completed job) before its record says how it was answered. Taken before ``lock``.
    handling: threading.RLock = field(default_factory=threading.RLock)
    publisher: Publisher = field(init=False)

    def __post_init__(self) -> None:
        self.publisher = Publisher(self.store, self.policy, self.now, lambda: self.take_fault("publish") is not None)

    def now(self) -> datetime:
        return now() + self.clock_offset

    def take_fault(self, endpoint: str) -> Fault | None:
        with self.lock:
            fault = self.faults.get(endpoint)
            if fault is None or fault.times <= 0:
                return None
            fault.times -= 1
            return fault


def _html(status: int, text: str) -> Response:
    return Response(f"<!DOCTYPE html><html><body><pre>{text}</pre></body></html>", status_code=status,
                    media_type="text/html")


def _parse_body(request: Request, raw: bytes) -> tuple[Any, Response | None]:
    """body-parser 1.x ``json()``: ``{}`` unless a JSON object/array arrives as ``application/json``."""
    if len(raw) > MAX_BODY_BYTES:
        return None, _html(413, "PayloadTooLargeError: request entity too large")
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not raw or ctype != "application/json":
        return {}, None
    try:
        body = json.loads(raw)
    except ValueError:
        return None, _html(400, "Bad Request")
    if not isinstance(body, (dict, list)):
        return None, _html(400, "Bad Request")
    return body, None


class WorkerApi:
    """The router: auth, fault injection, then one handler per Voicy route."""

    def __init__(self, state: ServerState) -> None:
        self.state, self.st, self.pub = state, state.store, state.publisher

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        at = self.state.now()
        raw = await request.body()
        body, error = _parse_body(request, raw)
        # recorded once its body is in: a reader that sees the request also sees what it carried
        entry: dict[str, Any] = {"method": request.method, "path": path,
                                 "json": body if body is not None else raw[:200].decode("utf-8", "replace"),
                                 "client": None, "peer": request.client.host if request.client else None,
                                 "endpoint": None, "status": 0, "at": at}
        with self.state.lock:
            self.state.requests.append(entry)
        with self.state.handling:
            response = error or self.route(request, path, body if isinstance(body, dict) else {}, entry)
            entry["status"] = response.status_code
        delay_s = self.state.delays.get(entry["endpoint"] or "")
        if delay_s:  # a slow server: the call is handled, its answer held (other requests go on)
            await asyncio.sleep(delay_s)
        return response

    def route(self, request: Request, path: str, body: dict[str, Any], entry: dict[str, Any]) -> Response:
        t = self.state.now()
        parts = request.headers.get("authorization", "").split(" ")
        if len(parts) != 2 or parts[0] != "Bearer" or not parts[1]:
            return JSONResponse({"error": "missing_worker_token"}, status_code=401)
        client = self.st.authenticate(parts[1], t)
        if client is None:
            return JSONResponse({"error": "invalid_worker_token"}, status_code=401)
        entry["client"] = client["name"]
        segs = path.rstrip("/").split("/")[3:]  # after /worker/v1
        segs = [s.lower() if i != 1 or s.lower() in CLAIMS else s for i, s in enumerate(segs)]
        method = "GET" if request.method == "HEAD" else request.method
        endpoint = self._endpoint(method, segs)
        entry["endpoint"] = endpoint
        if endpoint is None:
            return _html(404, f"Cannot {request.method} {path}")
        if endpoint in CLAIMS:
            entry["bucket"] = "newest" if body.get("bucket") == "newest" and endpoint != "claim" else "oldest"
        else:
            entry["job_id"] = segs[1]
        fault = self.state.take_fault(endpoint)
        if fault is not None:
            return JSONResponse({"error": fault.error}, status_code=fault.status)
        try:
            response = self.dispatch(endpoint, segs, body, client, t)
        except ApiError as exc:
            return JSONResponse({"error": exc.code}, status_code=exc.status)
        except Exception:  # asyncRoute: anything else is logged and becomes 500
            log.exception("dev voicy worker api error on %s", endpoint)
            return JSONResponse({"error": "worker_api_error"}, status_code=500)
        if endpoint in CLAIMS and response.status_code == 200:
            entry["claimed"] = json.loads(bytes(response.body))["job"]["id"]  # which job the claim took
        return response

    @staticmethod
    def _endpoint(method: str, segs: list[str]) -> str | None:
        """Express's route table; ``GET /jobs/claim`` lands on ``GET /jobs/:id`` as in the real one."""
        if not segs or segs[0] != "jobs" or len(segs) not in (2, 3):
            return None
        if method == "POST" and len(segs) == 2 and segs[1] in CLAIMS:
            return segs[1]
        if method == "GET":
            return "job" if len(segs) == 2 else ("source" if segs[2] == "source" else None)
        if method == "POST" and len(segs) == 3 and segs[2] in POST_ACTIONS:
            return segs[2]
        return None

    # --- handlers ------------------------------------------------------------------------------
    def dispatch(self, endpoint: str, segs: list[str], body: dict[str, Any], client: dict[str, Any],
                 t: datetime) -> Response:
        me = str(client["_id"])
        bucket = "newest" if body.get("bucket") == "newest" else "oldest"
        if endpoint == "claim-download":
            return self._maybe_job(self.claim_download(client, bucket, t))
        if endpoint == "claim-ready":
            return self._maybe_job(self.claim_ready(me, bucket, t))
        if endpoint == "claim":
            return self._maybe_job(self.claim_ready(me, "oldest", t) or self.claim_legacy(client, t))
        jid = object_id(segs[1])
        owned = {"_id": jid, "workerId": me, "status": {"$in": ACTIVE4}}
        transcribing = {"_id": jid, "workerId": me, "status": {"$in": TRANSCRIBING}}
        if endpoint == "job":
            return self._job(self.st.find_job(owned))
        if endpoint == "source":
            job = self._found(self.st.find_job(owned))
            src = {"jobId": str(job["_id"])}
            src.update({k: job[k] for k in SOURCE_KEYS if job.get(k) is not None
                        and not (k == "sourceUrl" and is_token_bearing(str(job[k])))})
            return JSONResponse({"source": src})
        if endpoint == "downloaded":
            lsp = body.get("localSourcePath")
            if lsp is not None and not isinstance(lsp, str):
                raise ApiError(400, "invalid_local_source_path")
            if not lsp or not lsp.strip():
                raise ApiError(400, "local_source_path_required")
            return self._job(self.st.update_job(
                {"_id": jid, "workerId": me, "status": "downloading"},
                {"$set": {"status": "ready", "localSourcePath": lsp, "downloadedAt": t, "heartbeatAt": t},
                 "$unset": {"lastError": ""}}, t))
        if endpoint == "transcribe":
            started = self.st.update_job({"_id": jid, "workerId": me, "status": "ready",
                                          "localSourcePath": NON_EMPTY},
                                         {"$set": {"status": "transcribing", "heartbeatAt": t}}, t)
            if started:
                self.pub.progress(started, "processing")
            return self._job(started)
        if endpoint == "heartbeat":
            return self._job(self.st.update_job(owned, {"$set": {"heartbeatAt": t}}, t))
        if endpoint == "progress":
            fields = progress_fields(body)
            job = self._found(self.st.update_job(
                transcribing, {"$set": {**fields, "heartbeatAt": t, "lastProgressAt": t}}, t))
            try:
                self.pub.progress(job, "partial")
            except Exception:  # awaited, but errors are caught and logged (§1.9)
                log.exception("progress publish failed")
            return self._job(self.st.find_job({"_id": jid}))
        if endpoint == "result":
            return self.result(transcribing, result_fields(body), t)
        return self.failure(owned, body, t)

    def claim_download(self, client: dict[str, Any], bucket: str, t: datetime) -> dict[str, Any] | None:
        job = self.st.update_job(
            {"status": {"$in": ["queued_for_download", "queued"]}},
            {"$set": {"status": "downloading", "workerId": str(client["_id"]), "claimedAt": t, "heartbeatAt": t},
             "$inc": {"attempts": 1}}, t, sort=[("createdAt", -1 if bucket == "newest" else 1)])
        if job:
            self.st.touch_client(client["_id"], {"lastClaimedAt": t})
        return job

    def claim_ready(self, me: str, bucket: str, t: datetime) -> dict[str, Any] | None:
        """Own ready jobs, or own transcribing/processing ones whose heartbeat went stale (§1.2, §3.2)."""
        cutoff = t - timedelta(milliseconds=self.state.policy.stale_active_job_ms)
        d = -1 if bucket == "newest" else 1
        flt = {"workerId": me, "localSourcePath": NON_EMPTY,
               "$or": [{"status": "ready"},
                       {"status": {"$in": TRANSCRIBING}, "heartbeatAt": {"$lt": cutoff}},
                       {"status": {"$in": TRANSCRIBING}, "heartbeatAt": {"$exists": False},
                        "claimedAt": {"$lt": cutoff}}]}
        job = self.st.update_job(flt, {"$set": {"status": "transcribing", "heartbeatAt": t}}, t,
                                 sort=[("downloadedAt", d), ("createdAt", d)])
        if job:
            self.pub.progress(job, "processing")
        return job

    def claim_legacy(self, client: dict[str, Any], t: datetime) -> dict[str, Any] | None:
        job = self.st.update_job(
            {"status": "queued", "sourceUrl": NON_EMPTY},
            {"$set": {"status": "processing", "workerId": str(client["_id"]), "claimedAt": t, "heartbeatAt": t},
             "$inc": {"attempts": 1}}, t, sort=[("createdAt", 1)])
        if job:
            self.st.touch_client(client["_id"], {"lastClaimedAt": t})
            self.pub.progress(job, "processing")
        return job

    def result(self, flt: dict[str, Any], fields: dict[str, Any], t: datetime) -> Response:
        """Store, publish (500 if it fails, job stays in progress), cache, then complete (§1.10)."""
        job = self._found(self.st.update_job(flt, {"$set": {**fields, "heartbeatAt": t},
                                                   "$unset": {"lastError": ""}}, t))
        try:
            self.pub.completed(job)
        except PublishError:
            log.warning("dev voicy: injected publish failure for job %s", job["_id"])
            return JSONResponse({"error": "worker_api_error"}, status_code=500)
        try:
            self.pub.cache(job)
        except Exception:  # logged and ignored
            log.exception("result cache write failed")
        return self._job(self.st.update_job(
            flt, {"$set": {"status": "completed", "heartbeatAt": t, "completedAt": t},
                  "$unset": {"lastError": "", "activeMediaCacheKey": ""}}, t))

    def failure(self, owned: dict[str, Any], body: dict[str, Any], t: datetime) -> Response:
        """Requeue while ``retryable`` and attempts < max, else fail for good (§1.11, §3.1)."""
        current = self._found(self.st.find_job(owned))
        error = body.get("error")
        error = js_slice(error if isinstance(error, str) else "Unknown worker error", MAX_ERROR_UNITS)
        retryable = js_truthy(body["retryable"]) if "retryable" in body else True
        update: dict[str, Any]
        if retryable and current.get("attempts", 0) < self.state.policy.max_attempts:
            update = {"$set": {"status": "queued_for_download", "lastError": error},
                      "$unset": {k: "" for k in ("workerId", "claimedAt", "heartbeatAt", "localSourcePath",
                                                 "downloadedAt")}}
            phase = "retrying"
        else:
            update = {"$set": {"status": "failed", "lastError": error, "heartbeatAt": t, "failedAt": t},
                      "$unset": {"activeMediaCacheKey": ""}}
            phase = "failed"
        job = self._found(self.st.update_job(owned, update, t))
        self.pub.progress(job, phase, force=True)
        return self._job(job)

    @staticmethod
    def _found(job: dict[str, Any] | None) -> dict[str, Any]:
        if job is None:
            raise ApiError(404, "job_not_found")
        return job

    def _job(self, job: dict[str, Any] | None) -> JSONResponse:
        return JSONResponse({"job": serialize(self._found(job))})

    @staticmethod
    def _maybe_job(job: dict[str, Any] | None) -> Response:
        return JSONResponse({"job": serialize(job)}) if job else Response(status_code=204)


def build_app(state: ServerState) -> Starlette:
    api, admin = WorkerApi(state), AdminApi(state)

    async def root(request: Request) -> Response:
        lowered = request.url.path.lower()
        if lowered == "/worker/v1" or lowered.startswith("/worker/v1/"):
            return await api(request)
        if lowered.startswith("/dev/v1/"):
            return await admin(request)
        return _html(404, f"Cannot {request.method} {request.url.path}")

    return Starlette(routes=[Route("/{rest:path}", root, methods=ALL_METHODS)])
