"""Regenerate ``workers/cairn/pb`` from ``proto/`` (``make proto``).

protoc emits ``from cairn.v1 import activity_pb2``; we rewrite those imports
to ``workers.cairn.pb.cairn.v1`` so the generated package works in place.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "workers" / "cairn" / "pb"
PACKAGE = "workers.cairn.pb"


def main() -> int:
    import grpc_tools
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    code = protoc.main(["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={OUT_DIR}", *protos])
    if code:
        return code
    for path in OUT_DIR.rglob("*_pb2.py"):
        text = re.sub(r"^from cairn\.", f"from {PACKAGE}.cairn.", path.read_text(), flags=re.M)
        path.write_text(text)
    for directory in [OUT_DIR, *[d for d in OUT_DIR.rglob("*") if d.is_dir() and d.name != "__pycache__"]]:
        (directory / "__init__.py").touch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
