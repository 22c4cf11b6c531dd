"""A fake Telegram Bot API: ``getFile`` and file downloads, in both URL forms (reference §6.4).

Cloud form: ``getFile`` returns a relative ``file_path`` (``voice/file_1.oga``)
served at ``/file/bot<TOKEN>/<path>``; files over 20 MB are refused as the
cloud API does. Local Bot API server (``--local``) form: ``file_path`` is an
absolute path on disk that a worker on the same host copies directly (it is
also served over HTTP). Errors have Telegram's shapes: wrong token -> 401
``Unauthorized``, unknown file -> 400 ``Bad Request: invalid file_id``.

The request log never holds the bot token (it is a secret inside every URL).

    tg = FakeTelegram("123:ABC").start()
    tg.add_file("AwAC-1", data)            # -> "voice/file_1.oga"
    tg.fail_next("AwAC-1", status=502)     # next getFile answers 502
    tg.delay("AwAC-1", 3.0)                # hold the download (a client timeout)
    tg.hang_up_next("AwAC-1")              # close the connection instead of answering the next getFile
    ...
    tg.stop()

CLI: ``python -m devstack.fakes.telegram --token T [--port N] [--local] [FILE_ID=PATH ...]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from devstack.fakes.http_server import BackgroundServer
from devstack.infra.services import free_port, listen_host

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
CLOUD_MAX_DOWNLOAD_BYTES = 20 * 1024 * 1024
DESCRIPTIONS = {400: "Bad Request: invalid file_id", 401: "Unauthorized", 403: "Forbidden",
                404: "Not Found", 429: "Too Many Requests: retry after 1", 500: "Internal Server Error",
                502: "Bad Gateway", 503: "Service Unavailable"}
Stage = Literal["getFile", "download"]
HangUp = Literal["close", "reset"]  # the connection closed with a FIN, or with an RST
NO_ANSWER = 0  # the request log's status of a request the server hung up on


def telegram_error(status: int, description: str | None = None) -> JSONResponse:
    body: dict[str, Any] = {"ok": False, "error_code": status,
                            "description": description or DESCRIPTIONS.get(status, "Error")}
    if status == 429:
        body["parameters"] = {"retry_after": 1}
    return JSONResponse(body, status_code=status)


@dataclass
class StoredFile:
    file_id: str
    file_unique_id: str
    file_path: str
    data: bytes


class FakeTelegram:
    def __init__(self, token: str, local_mode: bool = False, port: int | None = None) -> None:
        self.token, self.local_mode = token, local_mode
        self.port = port or free_port()
        self.files: dict[str, StoredFile] = {}
        self.requests: list[dict[str, Any]] = []
        self._fail: dict[tuple[str, Stage], list[int | HangUp]] = {}
        self._delay: dict[tuple[str, Stage], float] = {}
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._dir = Path(tempfile.mkdtemp(prefix="sy-tg-"))
        self.http: BackgroundServer | None = None

    @property
    def url(self) -> str:
        """The API root (``VOICY_WORKER_TELEGRAM_API_URL``), without a token."""
        return f"http://{listen_host()}:{self.port}"

    # --- test controls ---------------------------------------------------------------------------
    def add_file(self, file_id: str, data: bytes, path: str | None = None) -> str:
        """Register a file; returns the ``file_path`` that ``getFile`` will report."""
        rel = (path or f"voice/file_{next(self._counter)}.oga").lstrip("/")
        if self.local_mode:
            disk = self._dir / rel
            disk.parent.mkdir(parents=True, exist_ok=True)
            disk.write_bytes(data)
            file_path = str(disk)
        else:
            file_path = rel
        with self._lock:
            self.files[file_id] = StoredFile(file_id, f"AgAD-{file_id}"[:32], file_path, data)
        return file_path

    def fail_next(self, file_id: str, status: int = 404, times: int = 1, stage: Stage = "getFile") -> None:
        """The next ``times`` ``stage`` requests for ``file_id`` answer ``status`` (Telegram's error shape)."""
        with self._lock:
            self._fail[(file_id, stage)] = [status] * times

    def hang_up_next(self, file_id: str, stage: Stage = "getFile", times: int = 1, how: HangUp = "close") -> None:
        """The next ``times`` ``stage`` requests for ``file_id`` get no answer: the connection is closed.

        Any HTTP/1.1 server may close an idle keep-alive connection at any moment (RFC 9112 §9.3.1),
        Telegram's included: when its idle timer fires just as a client sends a request on that
        connection, the client sees the connection closed before any response. ``close`` is that
        close (a FIN: "Server disconnected without sending a response"); ``reset`` is the server
        closing with the request unread (an RST: a connection reset). Logged with status 0.
        """
        with self._lock:
            self._fail[(file_id, stage)] = [how] * times

    def delay(self, file_id: str, seconds: float, stage: Stage = "download") -> None:
        """Hold every ``stage`` response for ``file_id`` for ``seconds`` (a worker timeout)."""
        with self._lock:
            self._delay[(file_id, stage)] = seconds

    def clear_faults(self) -> None:
        with self._lock:
            self._fail.clear()
            self._delay.clear()

    def requests_of(self, kind: Stage) -> list[dict[str, Any]]:
        return [r for r in list(self.requests) if r["kind"] == kind]

    # --- server ----------------------------------------------------------------------------------
    def _take_fault(self, file_id: str, stage: Stage) -> int | HangUp | None:
        with self._lock:
            pending = self._fail.get((file_id, stage))
            return pending.pop(0) if pending else None

    async def _hang_up(self, request: Request, how: HangUp) -> Response:
        """Close the request's connection unanswered, then wait for uvicorn to notice (it drops any reply)."""
        peer = (request.client.host, request.client.port) if request.client else None
        if self.http is None or not self.http.hang_up(peer, reset=how == "reset"):
            return telegram_error(500, "fake Telegram: no connection to hang up")
        while (await request.receive())["type"] != "http.disconnect":
            pass
        return Response(status_code=NO_ANSWER)  # never sent: uvicorn drops a reply to a closed connection

    async def _hold(self, file_id: str, stage: Stage) -> None:
        seconds = self._delay.get((file_id, stage))
        if seconds:
            await asyncio.sleep(seconds)

    def _log(self, entry: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.requests.append(entry)
        return entry

    async def _get_me(self, request: Request) -> Response:
        """``getMe``: what ``switchyard doctor`` calls to check the bot token."""
        if request.path_params["token"] != self.token:
            return JSONResponse({"ok": False, "error_code": 401, "description": "Unauthorized"}, 401)
        bot_id = self.token.split(":", 1)[0]
        return JSONResponse({"ok": True, "result": {"id": int(bot_id) if bot_id.isdigit() else 0,
                                                    "is_bot": True, "username": "switchyard_dev_bot"}})

    async def _get_file(self, request: Request) -> Response:
        file_id = request.query_params.get("file_id", "")
        if not file_id and request.method == "POST":
            ctype = request.headers.get("content-type", "")
            if "json" in ctype:
                file_id = str((await request.json()).get("file_id", ""))
            else:
                file_id = str((await request.form()).get("file_id", ""))
        entry = self._log({"kind": "getFile", "file_id": file_id, "status": NO_ANSWER})
        response = await self._answer_get_file(request, file_id)
        if response.status_code != NO_ANSWER:
            entry["status"] = response.status_code
        return response

    async def _answer_get_file(self, request: Request, file_id: str) -> Response:
        if request.path_params["token"] != self.token:
            return telegram_error(401)
        await self._hold(file_id, "getFile")
        fault = self._take_fault(file_id, "getFile")
        if isinstance(fault, str):
            return await self._hang_up(request, fault)
        if fault is not None:
            return telegram_error(fault)
        stored = self.files.get(file_id)
        if stored is None:
            return telegram_error(400)
        if not self.local_mode and len(stored.data) > CLOUD_MAX_DOWNLOAD_BYTES:
            return telegram_error(400, "Bad Request: file is too big")
        return JSONResponse({"ok": True, "result": {"file_id": stored.file_id,
                                                    "file_unique_id": stored.file_unique_id,
                                                    "file_size": len(stored.data),
                                                    "file_path": stored.file_path}})

    async def _download(self, request: Request) -> Response:
        path = request.path_params["path"]
        entry = self._log({"kind": "download", "path": path, "status": NO_ANSWER})
        stored = next((f for f in list(self.files.values())
                       if f.file_path.lstrip("/") == path.lstrip("/")), None)
        if request.path_params["token"] != self.token:
            response: Response = telegram_error(401)
        elif stored is None:
            response = telegram_error(404)
        else:
            await self._hold(stored.file_id, "download")
            fault = self._take_fault(stored.file_id, "download")
            if isinstance(fault, str):
                return await self._hang_up(request, fault)
            response = telegram_error(fault) if fault is not None else \
                Response(stored.data, media_type="application/octet-stream")
        entry["status"] = response.status_code
        return response

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/bot{token}/getMe", self._get_me, methods=["GET", "POST"]),
            Route("/bot{token}/getFile", self._get_file, methods=["GET", "POST"]),
            Route("/file/bot{token}/{path:path}", self._download),
        ])

    def start(self) -> Self:
        self.http = BackgroundServer(self.app(), "fake-telegram", self.port, start_timeout_s=START_TIMEOUT_S,
                                     stop_timeout_s=STOP_TIMEOUT_S).start()
        return self

    def stop(self) -> None:
        if self.http is not None:
            self.http.stop()
            self.http = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> FakeTelegram:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.fakes.telegram")
    parser.add_argument("--token", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--local", action="store_true", help="absolute file_path (local Bot API server)")
    parser.add_argument("files", nargs="*", metavar="FILE_ID=PATH")
    args = parser.parse_args(argv)
    tg = FakeTelegram(args.token, local_mode=args.local, port=args.port or None)
    for spec in args.files:
        file_id, _, disk = spec.partition("=")
        print(f"{file_id} -> {tg.add_file(file_id, Path(disk).read_bytes())}")
    tg.start()
    print(f"fake Telegram Bot API on {tg.url}", flush=True)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
