"""Run the dev Voicy Worker API in a background thread on 127.0.0.1."""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta
from typing import Any

import uvicorn
from bson import ObjectId

from deploy.devstack.services import free_port
from deploy.devstack.voicy_api.app import Fault, ServerState, build_app
from deploy.devstack.voicy_api.store import Store, now

SERVER_START_TIMEOUT_S = 10.0
_message_ids = itertools.count(1000)


class DevVoicyServer:
    def __init__(self, port: int | None = None, mongo_url: str | None = None) -> None:
        self.state = ServerState(Store(mongo_url))
        self.port = port or free_port()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/worker/v1"

    @property
    def db(self) -> Any:
        return self.state.store.db

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return list(self.state.requests)

    @property
    def edits(self) -> list[dict[str, Any]]:
        return list(self.state.edits)

    def start(self) -> DevVoicyServer:
        config = uvicorn.Config(build_app(self.state), host="127.0.0.1", port=self.port,
                                log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="dev-voicy", daemon=True)
        self._thread.start()
        from deploy.devstack.services import wait_for_port

        wait_for_port(self.port, timeout_s=SERVER_START_TIMEOUT_S)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(SERVER_START_TIMEOUT_S)  # type: ignore[union-attr]

    def __enter__(self) -> DevVoicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- side channel (the real API has no job-creation endpoint) -----------------------------
    def create_client(self, name: str, token: str | None = None) -> str:
        return self.state.store.create_client(name, token)

    def disable_client(self, name: str) -> None:
        self.state.store.disable_client(name)

    def enqueue_job(self, file_id: str, *, file_path: str | None = None, file_size: int | None = None,
                    mime_type: str | None = "audio/ogg", source_kind: str = "voice",
                    language: str | None = None, source_url: str | None = None,
                    chat_type: str = "private", status: str = "queued_for_download") -> str:
        t = now()
        doc = {"status": status, "chatId": "chat-1", "telegramChatId": "1001",
               "telegramChatType": chat_type, "sourceMessageId": next(_message_ids),
               "statusMessageId": next(_message_ids), "fileId": file_id, "filePath": file_path,
               "fileSize": file_size, "mimeType": mime_type, "sourceKind": source_kind,
               "sourceUrl": source_url, "recognitionLanguageHint": language, "attempts": 0,
               "mediaCacheKey": f"telegram:{source_kind}:file_id:{file_id}", "createdAt": t, "updatedAt": t}
        doc = {k: v for k, v in doc.items() if v is not None}
        return str(self.state.store.jobs.insert_one(doc).inserted_id)

    def get_job(self, job_id: str) -> dict[str, Any]:
        job = self.state.store.jobs.find_one({"_id": ObjectId(job_id)})
        if job is None:
            raise KeyError(job_id)
        return job

    def inject_failure(self, endpoint: str, status: int = 503, times: int = 1) -> None:
        """Make the next ``times`` calls to ``endpoint`` (e.g. ``result``) answer ``status``."""
        self.state.faults[endpoint] = Fault(status, times)

    def advance_clock(self, seconds: float) -> None:
        """Move the server's clock forward, e.g. to make a heartbeat stale."""
        self.state.clock_offset += timedelta(seconds=seconds)
