"""Run the dev Voicy Worker API in a background thread on 127.0.0.1, with a test side channel."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from bson import ObjectId

from devstack.fakes.http_server import BackgroundServer
from devstack.fakes.voicy_api.admin import chat_unreachable_update, job_document
from devstack.fakes.voicy_api.app import Fault, ServerState, build_app
from devstack.fakes.voicy_api.policy import Policy
from devstack.fakes.voicy_api.store import Store
from devstack.infra.services import free_port, listen_host

SERVER_START_TIMEOUT_S = 10.0
SERVER_STOP_TIMEOUT_S = 10.0


class DevVoicyServer:
    """``with DevVoicyServer() as server:`` -> ``server.url`` is the ``/worker/v1`` base.

    ``env`` overrides the server-side variables (``VOICY_WORKER_MAX_ATTEMPTS``,
    ``VOICY_WORKER_STALE_ACTIVE_JOB_MS``, ``VOICY_PROGRESS_EDIT_INTERVAL_MS``,
    ``VOICY_DISABLE_TELEGRAM_PUBLISH``) for this server only; otherwise
    ``os.environ`` is read on every request.
    """

    def __init__(self, port: int | None = None, mongo_url: str | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.state = ServerState(Store(mongo_url), Policy(env))
        self.port = port or free_port()
        self.http: BackgroundServer | None = None

    @property
    def url(self) -> str:
        return f"{self.base_url}/worker/v1"

    @property
    def base_url(self) -> str:
        return f"http://{listen_host()}:{self.port}"

    @property
    def db(self) -> Any:
        return self.state.store.db

    @property
    def env(self) -> dict[str, str]:
        """Per-server overrides of the server's environment variables (mutable)."""
        return self.state.policy.overrides

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request received: ``method, path, status, json, client, peer, endpoint, bucket|job_id, at``
        (``client`` is the token's name, ``peer`` the sender's address: which host asked), and for a claim
        answered with a job, ``claimed``: that job's id."""
        with self.state.handling, self.state.lock:
            return list(self.state.requests)

    @property
    def edits(self) -> list[dict[str, Any]]:
        """Visible Telegram edits/sends the real server would make: ``jobId, phase, kind, text, at``."""
        return list(self.state.publisher.edits)

    def requests_for(self, endpoint: str, job_id: str | None = None) -> list[dict[str, Any]]:
        """Requests routed to ``endpoint`` (``claim-download``, ``progress``, ``job``, ...)."""
        return [r for r in self.requests if r.get("endpoint") == endpoint
                and (job_id is None or r.get("job_id") == job_id)]

    def start(self) -> DevVoicyServer:
        self.http = BackgroundServer(build_app(self.state), "dev-voicy", self.port,
                                     start_timeout_s=SERVER_START_TIMEOUT_S,
                                     stop_timeout_s=SERVER_STOP_TIMEOUT_S).start()
        return self

    def stop(self) -> None:
        if self.http is not None:
            self.http.stop()
            self.http = None

    def __enter__(self) -> DevVoicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- side channel (the real API has no job-creation endpoint) -----------------------------
    def create_client(self, name: str, token: str | None = None) -> str:
        """Returns the token once; only its SHA-256 is stored, ``enabled=True``. Duplicate names raise."""
        return self.state.store.create_client(name, token)

    def disable_client(self, name: str) -> None:
        self.state.store.disable_client(name)

    def enqueue_job(self, file_id: str, **kwargs: Any) -> str:
        """Create a job as the bot does from a Telegram message; see ``admin.job_document`` for keywords
        (``file_path, file_size, mime_type, source_kind, language, source_url, chat_type, status,
        file_unique_id, file_name, silent, status_message, created_at``)."""
        return self.state.store.insert_job(job_document(file_id, **kwargs))

    def get_job(self, job_id: str) -> dict[str, Any]:
        """The raw stored job (every field, including the hidden ones ``serializeJob`` leaves out)."""
        with self.state.handling:
            job = self.state.store.get_job(job_id)
        if job is None:
            raise KeyError(job_id)
        return job

    def update_job(self, job_id: str, fields: dict[str, Any]) -> None:
        """Set raw fields (e.g. an old ``heartbeatAt``) behind the API's back."""
        self.state.store.update_job({"_id": ObjectId(job_id)}, {"$set": fields})

    def mark_chat_unreachable(self, chat_id: str, reason: str = "Forbidden: bot was blocked by the user") -> int:
        """The bot found the chat unreachable (a permanent Telegram failure, reference §3.5): fail every
        active job of ``chat_id`` and unset its worker; returns how many jobs were failed."""
        flt, update = chat_unreachable_update(reason, self.state.now())
        return self.state.store.update_jobs({**flt, "chatId": chat_id}, update, self.state.now())

    def inject_failure(self, endpoint: str, status: int = 503, times: int = 1,
                       error: str = "worker_api_error") -> None:
        """Make the next ``times`` authenticated calls to ``endpoint`` answer ``status`` ``{"error": error}``.

        Endpoints: ``claim-download, claim-ready, claim, job, source, downloaded, transcribe,
        heartbeat, progress, result, failure``; and ``publish``: the final Telegram publish of
        ``/result`` fails, so the result is stored but the job stays transcribing and the
        response is 500 ``worker_api_error`` (reference §1.10 step 2).
        """
        with self.state.lock:
            self.state.faults[endpoint] = Fault(status, times, error)

    def delay(self, endpoint: str, seconds: float) -> None:
        """Hold every answer of ``endpoint`` for ``seconds`` (0 to stop): a slow server, e.g. to keep
        jobs in a known step long enough to observe them there. The call itself is handled at once."""
        with self.state.lock:
            self.state.delays[endpoint] = seconds

    def advance_clock(self, seconds: float) -> None:
        """Move the server's clock forward, e.g. to make a heartbeat stale."""
        self.state.clock_offset += timedelta(seconds=seconds)
