"""The side channel Voicy itself has no HTTP for: seeding jobs and worker clients, and bot-side events.

The real bot creates jobs from Telegram messages and a backend shell creates
worker clients, so neither exists in the Worker API. ``job_document`` builds a
job the way ``handleAudio.ts`` does (reference §2.1 "Job creation"), and the
dev-only ``/dev/v1`` endpoints expose it over HTTP so the CLI can seed an
in-process mongomock store. They have no auth: the server binds 127.0.0.1 only.
``chat_unreachable_update`` is what the bot does to a chat's jobs when Telegram
refuses it for good (§3.5); ``DevVoicyServer.mark_chat_unreachable`` applies it.

- ``POST /dev/v1/clients`` ``{"name"}`` -> 201 ``{"name", "token"}`` (409 on a duplicate name)
- ``POST /dev/v1/clients/<name>/disable`` -> 200
- ``POST /dev/v1/jobs`` ``{"fileId", ...enqueue_job keywords in camelCase}`` -> 201 ``{"id"}``
- ``GET /dev/v1/jobs/<id>`` -> the raw stored job (all fields, ISO dates)
"""

from __future__ import annotations

import itertools
import json
import threading
from datetime import datetime, timedelta
from typing import Any

from bson import ObjectId
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from devstack.fakes.voicy_api.store import DuplicateClientError, Store, now
from devstack.fakes.voicy_api.validate import MAX_ERROR_UNITS, iso, js_slice

_message_ids = itertools.count(1000)
_created_lock = threading.Lock()
_last_created: list[datetime] = []
SOURCE_KINDS = ("voice", "video_note", "audio", "document", "video")
CHAT_TYPES = ("private", "group", "supergroup", "channel")


def _monotonic_now() -> datetime:
    """Strictly increasing ``createdAt`` per process, so the oldest/newest buckets are deterministic."""
    with _created_lock:
        t = now()
        if _last_created and t <= _last_created[0]:
            t = _last_created[0] + timedelta(milliseconds=1)
        _last_created[:] = [t]
        return t


def media_cache_key(file_id: str, file_unique_id: str | None, source_kind: str) -> str:
    if file_unique_id:
        return f"telegram:file_unique_id:{file_unique_id}"
    return f"telegram:{source_kind}:file_id:{file_id}"


def job_document(file_id: str, *, file_path: str | None = None, file_size: int | None = None,
                 mime_type: str | None = "audio/ogg", source_kind: str = "voice",
                 language: str | None = None, source_url: str | None = None, chat_type: str = "private",
                 status: str = "queued_for_download", file_unique_id: str | None = None,
                 file_name: str | None = None, chat_id: str = "chat-1", telegram_chat_id: str = "1001",
                 silent: bool = False, status_message: bool = True, requested_by_user_id: str | None = "42",
                 created_at: datetime | None = None) -> dict[str, Any]:
    """A ``queued_for_download`` job as the bot creates it: no ``sourceUrl`` unless legacy."""
    if source_kind not in SOURCE_KINDS:
        raise ValueError(f"sourceKind must be one of {SOURCE_KINDS}")
    if chat_type not in CHAT_TYPES:
        raise ValueError(f"chat type must be one of {CHAT_TYPES}")
    t = created_at or _monotonic_now()
    source_message_id = next(_message_ids)
    # Silent chats, channels and guest queries get no acknowledgement message (§2.1).
    has_ack = status_message and not silent and chat_type != "channel"
    key = media_cache_key(file_id, file_unique_id, source_kind)
    doc = {"status": status, "chatId": chat_id, "telegramChatId": telegram_chat_id,
           "telegramChatType": chat_type, "sourceMessageId": source_message_id,
           "statusMessageId": next(_message_ids) if has_ack else None, "silent": silent or None,
           "fileId": file_id, "fileUniqueId": file_unique_id, "mediaCacheKey": key, "activeMediaCacheKey": key,
           "filePath": file_path, "fileSize": file_size, "mimeType": mime_type, "fileName": file_name,
           "sourceKind": source_kind, "sourceUrl": source_url, "requestedByUserId": requested_by_user_id,
           "uiLocale": "en", "recognitionLanguageHint": language, "attempts": 0,
           "createdAt": t, "updatedAt": t}
    return {k: v for k, v in doc.items() if v is not None}


# The bot's "active" statuses (reference §2.1): per-chat limit, dedupe, and chat-unreachable cancels.
ACTIVE_STATUSES = ("queued_for_download", "downloading", "ready", "queued", "processing", "transcribing")
UNREACHABLE_UNSET = ("activeMediaCacheKey", "workerId", "claimedAt", "downloadedAt", "heartbeatAt",
                     "localSourcePath", "statusMessagePublishingAt")


def chat_unreachable_update(reason: str, t: datetime) -> tuple[dict[str, Any], dict[str, Any]]:
    """``chatReachability.ts`` (reference §3.5): the filter and update applied to a chat's active jobs.

    A permanent Telegram failure fails every active job of the chat and drops its
    worker, so the worker holding one gets 404 ``job_not_found`` on its next call.
    """
    update = {"$set": {"status": "failed", "lastError": js_slice(reason, MAX_ERROR_UNITS), "failedAt": t},
              "$unset": {k: "" for k in UNREACHABLE_UNSET}}
    return {"status": {"$in": list(ACTIVE_STATUSES)}}, update


CAMEL = {"filePath": "file_path", "fileSize": "file_size", "mimeType": "mime_type",
         "sourceKind": "source_kind", "language": "language", "sourceUrl": "source_url",
         "chatType": "chat_type", "status": "status", "fileUniqueId": "file_unique_id",
         "fileName": "file_name", "chatId": "chat_id", "telegramChatId": "telegram_chat_id",
         "silent": "silent"}


def _jsonable(doc: dict[str, Any]) -> dict[str, Any]:
    return {("id" if k == "_id" else k): (str(v) if isinstance(v, ObjectId) else iso(v)) for k, v in doc.items()}


class AdminApi:
    def __init__(self, state: Any) -> None:
        self.store: Store = state.store

    async def __call__(self, request: Request) -> Response:
        segs = request.url.path.rstrip("/").split("/")[3:]
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return JSONResponse({"error": "invalid_json"}, status_code=400)
        method = request.method
        try:
            if method == "POST" and segs == ["clients"]:
                name = body.get("name")
                if not isinstance(name, str) or not name:
                    return JSONResponse({"error": "name_required"}, status_code=400)
                return JSONResponse({"name": name, "token": self.store.create_client(name)}, status_code=201)
            if method == "POST" and len(segs) == 3 and segs[0] == "clients" and segs[2] == "disable":
                self.store.disable_client(segs[1])
                return JSONResponse({"name": segs[1], "enabled": False})
            if method == "POST" and segs == ["jobs"]:
                if not isinstance(body.get("fileId"), str) or not body["fileId"]:
                    return JSONResponse({"error": "file_id_required"}, status_code=400)
                kwargs = {CAMEL[k]: v for k, v in body.items() if k in CAMEL}
                doc = job_document(body["fileId"], **kwargs)
                return JSONResponse({"id": self.store.insert_job(doc)}, status_code=201)
            if method == "GET" and len(segs) == 2 and segs[0] == "jobs" and ObjectId.is_valid(segs[1]):
                job = self.store.get_job(segs[1])
                if job is not None:
                    return JSONResponse(_jsonable(job))
        except DuplicateClientError:
            return JSONResponse({"error": "duplicate_client"}, status_code=409)
        except KeyError:
            return JSONResponse({"error": "not_found"}, status_code=404)
        except (ValueError, TypeError) as exc:
            return JSONResponse({"error": "bad_request", "detail": str(exc)}, status_code=400)
        return JSONResponse({"error": "not_found"}, status_code=404)
