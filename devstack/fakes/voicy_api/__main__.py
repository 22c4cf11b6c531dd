"""CLI for the dev Voicy Worker API: ``serve``, ``create-client``, ``enqueue``, ``disable-client``.

``create-client``/``enqueue``/``disable-client`` write to the MongoDB at
``VOICY_DEV_MONGO_URL`` when it is set (the serving process reads the same
database); otherwise they call the running server's dev-only ``/dev/v1``
endpoints at ``--server`` (default ``http://127.0.0.1:4242``), which is the
only way into an in-process mongomock store.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading

import httpx

from devstack.fakes.voicy_api.admin import job_document
from devstack.fakes.voicy_api.server import DevVoicyServer
from devstack.fakes.voicy_api.store import DuplicateClientError, Store

DEFAULT_PORT = 4242  # the real server's fixed port (reference §1.0)
ADMIN_TIMEOUT_S = 10.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m devstack.fakes.voicy_api")
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", help="run the dev Worker API on 127.0.0.1")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    for name in ("create-client", "disable-client", "enqueue"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--server", default=f"http://127.0.0.1:{DEFAULT_PORT}",
                         help="running dev server (used when VOICY_DEV_MONGO_URL is unset)")
        if name != "enqueue":
            cmd.add_argument("name")
    enq = sub.choices["enqueue"]
    enq.add_argument("--file-id", required=True)
    enq.add_argument("--file-path")
    enq.add_argument("--file-size", type=int)
    enq.add_argument("--file-unique-id")
    enq.add_argument("--mime-type", default="audio/ogg")
    enq.add_argument("--source-kind", default="voice")
    enq.add_argument("--language")
    enq.add_argument("--chat-type", default="private")
    return parser


def _admin(server: str, method: str, path: str, body: dict | None = None) -> dict:
    response = httpx.request(method, server.rstrip("/") + "/dev/v1" + path, json=body, timeout=ADMIN_TIMEOUT_S)
    if response.status_code >= 400:
        raise SystemExit(f"dev server answered {response.status_code}: {response.text}")
    return response.json()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "serve":
        server = DevVoicyServer(port=args.port or None).start()
        print(f"dev Voicy Worker API on {server.url}", flush=True)
        threading.Event().wait()
        return 0
    direct = bool(os.environ.get("VOICY_DEV_MONGO_URL"))
    if args.cmd == "create-client":
        try:
            token = Store().create_client(args.name) if direct else \
                _admin(args.server, "POST", "/clients", {"name": args.name})["token"]
        except DuplicateClientError as exc:
            print(exc, file=sys.stderr)
            return 1
        # The real script's three lines (reference §2.2).
        print(f"Worker client created: {args.name}\nToken: {token}\nStore this token now; only its hash was saved.")
        return 0
    if args.cmd == "disable-client":
        if direct:
            Store().disable_client(args.name)
        else:
            _admin(args.server, "POST", f"/clients/{args.name}/disable")
        print(f"Worker client disabled: {args.name}")
        return 0
    fields = {"file_path": args.file_path, "file_size": args.file_size, "file_unique_id": args.file_unique_id,
              "mime_type": args.mime_type, "source_kind": args.source_kind, "language": args.language,
              "chat_type": args.chat_type}
    fields = {k: v for k, v in fields.items() if v is not None}
    if direct:
        job_id = Store().insert_job(job_document(args.file_id, **fields))
    else:
        camel = {"file_path": "filePath", "file_size": "fileSize", "file_unique_id": "fileUniqueId",
                 "mime_type": "mimeType", "source_kind": "sourceKind", "language": "language",
                 "chat_type": "chatType"}
        job_id = _admin(args.server, "POST", "/jobs",
                        {"fileId": args.file_id, **{camel[k]: v for k, v in fields.items()}})["id"]
    print(job_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
