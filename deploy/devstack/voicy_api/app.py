"""The dev Voicy Worker API: every ``/worker/v1`` endpoint as the real server behaves.

Status codes, error bodies, filters and updates follow reference/voicy.md §1-§4
and its test-double checklist: JSON parsed before auth, strict ``Bearer``,
ids validated before bodies, 404 ``job_not_found`` for every ownership or
state mismatch, never 403/409, optional fields omitted keep stored values.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from deploy.devstack.voicy_api.store import Store, now
from deploy.devstack.voicy_api.validate import ApiError, object_id, progress_fields, result_fields

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_STALE_MS = 900_000
DEFAULT_EDIT_INTERVAL_MS = 2500
MIN_EDIT_INTERVAL_MS = 1000
ACTIVE4 = ["downloading", "ready", "transcribing", "processing"]
TRANSCRIBING = ["transcribing", "processing"]
SERIALIZED = ["status", "chatId", "telegramChatId", "telegramChatType", "sourceMessageId",
              "statusMessageId", "requestMessageId", "fileId", "fileUniqueId", "filePath",
              "localSourcePath", "fileSize", "mimeType", "fileName", "sourceKind", "sourceUrl",
              "requestedByUserId", "forwardedFromUserId", "forwardedSenderName",
              "recognitionLanguageHint", "partialResultText", "lastProgressAt",
              "lastProgressPublishedAt", "attempts", "claimedAt", "downloadedAt", "heartbeatAt",
              "createdAt", "updatedAt"]


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        return default
    return value if value > 0 else default


def _iso(v: Any) -> Any:
    return v.strftime("%Y-%m-%dT%H:%M:%S.") + f"{v.microsecond // 1000:03d}Z" if hasattr(v, "strftime") else v


def serialize(job: dict[str, Any]) -> dict[str, Any]:
    from workers.voicy.telegram import is_token_bearing

    out: dict[str, Any] = {"id": str(job["_id"])}
    for key in SERIALIZED:
        if job.get(key) is None or (key == "sourceUrl" and is_token_bearing(job[key])):
            continue
        out[key] = _iso(job[key])
    return out


@dataclass
class Fault:
    status: int
    times: int


@dataclass
class ServerState:
    store: Store
    requests: list[dict[str, Any]] = field(default_factory=list)
    edits: list[dict[str, Any]] = field(default_factory=list)
    faults: dict[str, Fault] = field(default_factory=dict)
    clock_offset: timedelta = timedelta(0)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def max_attempts(self) -> float:
        return _env_number("VOICY_WORKER_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS)

    @property
    def stale_s(self) -> float:
        return _env_number("VOICY_WORKER_STALE_ACTIVE_JOB_MS", DEFAULT_STALE_MS) / 1000

    @property
    def edit_interval_s(self) -> float:
        raw = os.environ.get("VOICY_PROGRESS_EDIT_INTERVAL_MS")
        if raw is None:
            return DEFAULT_EDIT_INTERVAL_MS / 1000
        try:
            value = float(raw or 0)
        except ValueError:
            return DEFAULT_EDIT_INTERVAL_MS / 1000
        return max(value, MIN_EDIT_INTERVAL_MS) / 1000

    def now(self):  # type: ignore[no-untyped-def]
        return now() + self.clock_offset


def build_app(state: ServerState) -> Starlette:
    st = state.store

    def publish(job: dict[str, Any], phase: str, force: bool = False) -> None:
        """Record a visible status edit when the real server would make one (§4)."""
        if os.environ.get("VOICY_DISABLE_TELEGRAM_PUBLISH") == "1":
            return
        if job.get("telegramChatType") == "channel" or job.get("statusMessageId") is None:
            return
        last = job.get("lastProgressPublishedAt")
        t = state.now()
        if not force and last is not None and (t - last).total_seconds() < state.edit_interval_s:
            return
        state.edits.append({"jobId": str(job["_id"]), "phase": phase,
                            "text": job.get("partialResultText") or job.get("resultText")})
        if phase == "partial":
            st.jobs.update_one({"_id": job["_id"]}, {"$set": {"lastProgressPublishedAt": t}})

    def owned(jid, client, statuses):  # type: ignore[no-untyped-def]
        return {"_id": jid, "workerId": str(client["_id"]), "status": {"$in": statuses}}

    def job_response(job: dict[str, Any] | None) -> JSONResponse:
        if job is None:
            raise ApiError(404, "job_not_found")
        return JSONResponse({"job": serialize(job)})

    def claim_ready(client: dict[str, Any], bucket: str) -> dict[str, Any] | None:
        t = state.now()
        cutoff = t - timedelta(seconds=state.stale_s)
        d = -1 if bucket == "newest" else 1
        flt = {"workerId": str(client["_id"]), "localSourcePath": {"$exists": True, "$nin": ["", None]},
               "$or": [{"status": "ready"},
                       {"status": {"$in": TRANSCRIBING}, "heartbeatAt": {"$lt": cutoff}},
                       {"status": {"$in": TRANSCRIBING}, "heartbeatAt": {"$exists": False},
                        "claimedAt": {"$lt": cutoff}}]}
        job = st.update_one_job(flt, {"$set": {"status": "transcribing", "heartbeatAt": t}},
                                sort=[("downloadedAt", d), ("createdAt", d)])
        if job:
            publish(job, "processing")
        return job

    async def handle(request: Request) -> Response:
        path = request.url.path
        raw = await request.body()
        body: Any = {}
        if raw and "application/json" in request.headers.get("content-type", ""):
            try:
                body = json.loads(raw)
            except ValueError:
                return Response("Bad Request", status_code=400, media_type="text/html")
            if not isinstance(body, (dict, list)):
                return Response("Bad Request", status_code=400, media_type="text/html")
        body = body if isinstance(body, dict) else {}
        entry = {"method": request.method, "path": path, "json": body, "client": None, "status": 0}
        with state.lock:
            state.requests.append(entry)
        response = route(request, path, body, entry)
        entry["status"] = response.status_code
        return response

    def route(request: Request, path: str, body: dict[str, Any], entry: dict[str, Any]) -> Response:
        parts = request.headers.get("authorization", "").split(" ")
        if len(parts) != 2 or parts[0] != "Bearer" or not parts[1]:
            return JSONResponse({"error": "missing_worker_token"}, status_code=401)
        client = st.authenticate(parts[1])
        if client is None:
            return JSONResponse({"error": "invalid_worker_token"}, status_code=401)
        entry["client"] = client["name"]
        segs = path.rstrip("/").split("/")[3:]  # after /worker/v1
        endpoint = segs[-1] if len(segs) == 3 else (segs[1] if len(segs) == 2 else "")
        fault = state.faults.get(endpoint)
        if fault and fault.times > 0:
            fault.times -= 1
            return JSONResponse({"error": "worker_api_error"}, status_code=fault.status)
        try:
            return dispatch(request.method, segs, body, client)
        except ApiError as exc:
            return JSONResponse({"error": exc.code}, status_code=exc.status)

    def dispatch(method: str, segs: list[str], body: dict[str, Any], client: dict[str, Any]) -> Response:
        me = str(client["_id"])
        t = state.now()
        bucket = "newest" if body.get("bucket") == "newest" else "oldest"
        if method == "POST" and segs == ["jobs", "claim-download"]:
            job = st.update_one_job({"status": {"$in": ["queued_for_download", "queued"]}},
                                    {"$set": {"status": "downloading", "workerId": me, "claimedAt": t,
                                              "heartbeatAt": t}, "$inc": {"attempts": 1}},
                                    sort=[("createdAt", -1 if bucket == "newest" else 1)])
            if job is None:
                return Response(status_code=204)
            st.clients.update_one({"_id": client["_id"]}, {"$set": {"lastClaimedAt": t}})
            return job_response(job)
        if method == "POST" and segs == ["jobs", "claim-ready"]:
            job = claim_ready(client, bucket)
            return job_response(job) if job else Response(status_code=204)
        if method == "POST" and segs == ["jobs", "claim"]:
            job = claim_ready(client, "oldest") or st.update_one_job(
                {"status": "queued", "sourceUrl": {"$exists": True, "$nin": ["", None]}},
                {"$set": {"status": "processing", "workerId": me, "claimedAt": t, "heartbeatAt": t},
                 "$inc": {"attempts": 1}}, sort=[("createdAt", 1)])
            return job_response(job) if job else Response(status_code=204)
        if len(segs) not in (2, 3) or segs[0] != "jobs":
            return Response("Cannot " + method, status_code=404, media_type="text/html")
        jid = object_id(segs[1])
        action = segs[2] if len(segs) == 3 else ""
        if method == "GET" and action in ("", "source"):
            job = st.jobs.find_one(owned(jid, client, ACTIVE4))
            if job is None or action == "":
                return job_response(job)
            from workers.voicy.telegram import is_token_bearing

            src = {"jobId": str(job["_id"])}
            for k in ("fileId", "fileUniqueId", "filePath", "localSourcePath", "fileSize", "mimeType",
                      "fileName", "sourceKind", "sourceUrl"):
                if job.get(k) is not None and not (k == "sourceUrl" and is_token_bearing(job[k])):
                    src[k] = job[k]
            return JSONResponse({"source": src})
        if method != "POST":
            return Response("Cannot " + method, status_code=404, media_type="text/html")
        if action == "downloaded":
            lsp = body.get("localSourcePath")
            if lsp is not None and not isinstance(lsp, str):
                raise ApiError(400, "invalid_local_source_path")
            if not lsp or not lsp.strip():
                raise ApiError(400, "local_source_path_required")
            return job_response(st.update_one_job(
                {"_id": jid, "workerId": me, "status": "downloading"},
                {"$set": {"status": "ready", "localSourcePath": lsp, "downloadedAt": t, "heartbeatAt": t},
                 "$unset": {"lastError": ""}}))
        if action == "transcribe":
            job = st.update_one_job({"_id": jid, "workerId": me, "status": "ready",
                                     "localSourcePath": {"$exists": True, "$nin": ["", None]}},
                                    {"$set": {"status": "transcribing", "heartbeatAt": t}})
            if job:
                publish(job, "processing")
            return job_response(job)
        if action == "heartbeat":
            return job_response(st.update_one_job(owned(jid, client, ACTIVE4), {"$set": {"heartbeatAt": t}}))
        if action == "progress":
            fields = progress_fields(body)
            job = st.update_one_job(owned(jid, client, TRANSCRIBING),
                                    {"$set": {**fields, "heartbeatAt": t, "lastProgressAt": t}})
            if job:
                publish(job, "partial")
                job = st.jobs.find_one({"_id": jid})
            return job_response(job)
        if action == "result":
            fields = result_fields(body)
            job = st.update_one_job(owned(jid, client, TRANSCRIBING),
                                    {"$set": {**fields, "heartbeatAt": t}, "$unset": {"lastError": ""}})
            if job is None:
                raise ApiError(404, "job_not_found")
            st.voices.update_one({"chatId": job.get("chatId"), "sourceMessageId": job.get("sourceMessageId")},
                                 {"$set": {"text": job["resultText"], "url": job.get("localSourcePath")}},
                                 upsert=True)
            publish(job, "completed", force=True)
            return job_response(st.update_one_job(
                owned(jid, client, TRANSCRIBING),
                {"$set": {"status": "completed", "heartbeatAt": t, "completedAt": t},
                 "$unset": {"lastError": "", "activeMediaCacheKey": ""}}))
        if action == "failure":
            current = st.jobs.find_one(owned(jid, client, ACTIVE4))
            if current is None:
                raise ApiError(404, "job_not_found")
            error = body.get("error")
            error = (error if isinstance(error, str) else "Unknown worker error")[:2000]
            retryable = bool(body.get("retryable", True))
            if retryable and current.get("attempts", 0) < state.max_attempts:
                update = {"$set": {"status": "queued_for_download", "lastError": error},
                          "$unset": {k: "" for k in ("workerId", "claimedAt", "heartbeatAt",
                                                     "localSourcePath", "downloadedAt")}}
                phase = "retrying"
            else:
                update = {"$set": {"status": "failed", "lastError": error, "heartbeatAt": t, "failedAt": t},
                          "$unset": {"activeMediaCacheKey": ""}}
                phase = "failed"
            job = st.update_one_job(owned(jid, client, ACTIVE4), update)
            if job:
                publish(job, phase, force=True)
            return job_response(job)
        return Response("Cannot POST", status_code=404, media_type="text/html")

    return Starlette(routes=[Route("/worker/v1/{rest:path}", handle, methods=["GET", "POST"])])
