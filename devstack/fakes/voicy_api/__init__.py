"""Dev Voicy Worker API for tests and the demo: behaves like Voicy's ``/worker/v1``.

Modules: ``app`` (router and handlers, reference/voicy.md §1), ``validate``
(body and id validation in the real order), ``policy`` (server env vars, JS
``Number()`` parsing), ``publish`` (recorded Telegram edits, Voice record,
result cache), ``store`` (pymongo or mongomock), ``admin`` (job seeding and
the dev-only ``/dev/v1`` endpoints), ``server`` (``DevVoicyServer``).

Python API::

    with DevVoicyServer(env={"VOICY_WORKER_MAX_ATTEMPTS": "2"}) as server:
        token = server.create_client("worker-a")     # only the SHA-256 is stored
        job_id = server.enqueue_job("AwAC-file-id", file_size=1234)
        ...                                          # a worker talks to server.url
        server.get_job(job_id)["status"]             # raw stored document
        server.requests_for("progress", job_id)      # request log entries
        server.edits                                 # visible Telegram edits
        server.inject_failure("result", status=503, times=1)
        server.advance_clock(30 * 60)                # make heartbeats stale
        server.mark_chat_unreachable("chat-1")       # the bot fails the chat's active jobs (§3.5)

The store is mongomock in-process unless ``VOICY_DEV_MONGO_URL`` (or
``mongo_url=``) names a real MongoDB.

CLI::

    python -m devstack.fakes.voicy_api serve [--port 4242]     # --port 0: a free port
    python -m devstack.fakes.voicy_api create-client NAME      # prints the token once
    python -m devstack.fakes.voicy_api enqueue --file-id X [--file-path P --file-size N ...]
    python -m devstack.fakes.voicy_api disable-client NAME

The last three write to ``VOICY_DEV_MONGO_URL`` when set, otherwise they call
the running server's dev-only endpoints (``--server http://127.0.0.1:4242``):
``POST /dev/v1/clients``, ``POST /dev/v1/clients/<name>/disable``,
``POST /dev/v1/jobs``, ``GET /dev/v1/jobs/<id>`` (no auth; loopback only).
"""

from devstack.fakes.voicy_api.server import DevVoicyServer
from devstack.fakes.voicy_api.store import DuplicateClientError

__all__ = ["DevVoicyServer", "DuplicateClientError"]
