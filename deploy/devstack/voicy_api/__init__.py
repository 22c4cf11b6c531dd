"""Dev Voicy Worker API for tests and the demo (see ``app.py`` for the behaviour).

Python API: ``DevVoicyServer().start()``; ``.url`` is the ``/worker/v1`` base;
``create_client(name)`` returns a token (only its SHA-256 is stored);
``enqueue_job(file_id, ...)`` seeds a ``queued_for_download`` job as the bot
would; ``requests`` records every call; ``inject_failure(endpoint, status, times)``.

CLI: ``python -m deploy.devstack.voicy_api serve --port N``,
``create-client NAME`` and ``enqueue --file-id X`` (the last two need
``VOICY_DEV_MONGO_URL`` so they share the serving process's store).
"""

from deploy.devstack.voicy_api.server import DevVoicyServer

__all__ = ["DevVoicyServer"]
