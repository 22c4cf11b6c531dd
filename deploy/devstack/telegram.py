"""A fake Telegram Bot API: ``getFile`` and file downloads, in both URL forms.

Cloud form: ``getFile`` returns a relative ``file_path`` served at
``/file/bot<TOKEN>/<path>``. Local Bot API (``--local``) form: ``file_path`` is
an absolute path on disk, which a worker on the same host copies directly.
Errors have Telegram's shapes (401 Unauthorized, 400 invalid file_id).
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from deploy.devstack.services import free_port, wait_for_port

START_TIMEOUT_S = 10.0


class FakeTelegram:
    def __init__(self, token: str, local_mode: bool = False, port: int | None = None) -> None:
        self.token, self.local_mode = token, local_mode
        self.port = port or free_port()
        self.files: dict[str, tuple[str, bytes]] = {}
        self.requests: list[dict[str, Any]] = []
        self._fail: dict[str, int] = {}
        self._delay: dict[str, float] = {}
        self._dir = Path(tempfile.mkdtemp(prefix="sy-tg-"))
        self._server: uvicorn.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add_file(self, file_id: str, data: bytes, path: str | None = None) -> str:
        if self.local_mode:
            disk = self._dir / (path or f"{file_id}.oga").replace("/", "_")
            disk.write_bytes(data)
            file_path = str(disk)
        else:
            file_path = path or f"voice/{file_id}.oga"
        self.files[file_id] = (file_path, data)
        return file_path

    def fail_next(self, file_id: str, status: int = 404, times: int = 1) -> None:
        """Answer getFile for ``file_id`` with ``status``; 404 mirrors a file Telegram lost."""
        self._fail[file_id] = status if times else 0

    def delay(self, file_id: str, seconds: float) -> None:
        """Hold the download of ``file_id`` for ``seconds`` (a worker timeout)."""
        self._delay[file_id] = seconds

    def _app(self) -> Starlette:
        async def get_file(request: Request) -> Response:
            token = request.path_params["token"]
            file_id = request.query_params.get("file_id", "")
            self.requests.append({"kind": "getFile", "file_id": file_id})
            if token != self.token:
                return JSONResponse({"ok": False, "error_code": 401, "description": "Unauthorized"}, 401)
            if file_id in self._fail:
                status = self._fail.pop(file_id)
                return JSONResponse({"ok": False, "error_code": status, "description": "Not Found"}, status)
            if file_id not in self.files:
                return JSONResponse({"ok": False, "error_code": 400,
                                     "description": "Bad Request: invalid file_id"}, 400)
            path, data = self.files[file_id]
            return JSONResponse({"ok": True, "result": {"file_id": file_id, "file_unique_id": f"u-{file_id}",
                                                        "file_size": len(data), "file_path": path}})

        async def download(request: Request) -> Response:
            token, path = request.path_params["token"], request.path_params["path"]
            self.requests.append({"kind": "download", "path": path})
            if token != self.token:
                return JSONResponse({"ok": False, "error_code": 401, "description": "Unauthorized"}, 401)
            for file_id, (file_path, data) in self.files.items():
                if file_path == path:
                    if file_id in self._delay:
                        await asyncio.sleep(self._delay[file_id])
                    return Response(data, media_type="application/octet-stream")
            return JSONResponse({"ok": False, "error_code": 404, "description": "Not Found"}, 404)

        async def get_me(request: Request) -> Response:
            if request.path_params["token"] != self.token:
                return JSONResponse({"ok": False, "error_code": 401, "description": "Unauthorized"}, 401)
            return JSONResponse({"ok": True, "result": {"id": int(self.token.split(":")[0] or 0),
                                                        "is_bot": True, "username": "switchyard_dev_bot"}})

        return Starlette(routes=[
            Route("/bot{token}/getMe", get_me, methods=["GET", "POST"]),
            Route("/bot{token}/getFile", get_file, methods=["GET", "POST"]),
            Route("/file/bot{token}/{path:path}", download),
        ])

    def start(self) -> FakeTelegram:
        config = uvicorn.Config(self._app(), host="127.0.0.1", port=self.port, log_level="warning",
                                access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        threading.Thread(target=self._server.run, name="fake-telegram", daemon=True).start()
        wait_for_port(self.port, timeout_s=START_TIMEOUT_S)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
