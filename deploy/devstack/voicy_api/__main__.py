"""CLI for the dev Voicy Worker API: serve, create-client, enqueue."""

from __future__ import annotations

import argparse
import os
import sys
import threading

from deploy.devstack.voicy_api.server import DevVoicyServer
from deploy.devstack.voicy_api.store import Store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.devstack.voicy_api")
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("--port", type=int, default=None)
    cc = sub.add_parser("create-client")
    cc.add_argument("name")
    enq = sub.add_parser("enqueue")
    enq.add_argument("--file-id", required=True)
    enq.add_argument("--file-path")
    enq.add_argument("--mime-type", default="audio/ogg")
    args = parser.parse_args(argv)
    if args.cmd == "serve":
        server = DevVoicyServer(port=args.port).start()
        print(f"dev Voicy Worker API on {server.url}", flush=True)
        threading.Event().wait()
    if not os.environ.get("VOICY_DEV_MONGO_URL"):
        print("VOICY_DEV_MONGO_URL must point at the MongoDB the server uses", file=sys.stderr)
        return 2
    if args.cmd == "create-client":
        print(Store().create_client(args.name))
        return 0
    server = DevVoicyServer.__new__(DevVoicyServer)
    from deploy.devstack.voicy_api.app import ServerState

    server.state = ServerState(Store())
    print(server.enqueue_job(args.file_id, file_path=args.file_path, mime_type=args.mime_type))
    return 0


if __name__ == "__main__":
    sys.exit(main())
