"""Regenerate ``workers/cairn/contract/pb`` from ``proto/`` (``make proto``)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "workers" / "cairn" / "contract" / "pb"
PACKAGE = "workers.cairn.contract.pb"


def build(out_dir: Path = OUT_DIR) -> int:
    """Compile every ``proto/**/*.proto`` into ``out_dir``; returns protoc's exit code.

    Stubs (``.pyi``) come beside the modules, so mypy sees the messages' fields. protoc's
    ``from cairn.v1 import`` lines are rewritten to ``workers.cairn.contract.pb.cairn.v1``
    so the package works in place without ``workers/cairn/contract/pb`` on ``sys.path``. A test
    regenerates into a temporary ``out_dir`` and compares, so a .proto edit without regeneration
    fails. ``python -m workers.cairn.contract.proto_build [--out DIR]`` runs it.
    """
    # Function-level on purpose: grpcio-tools is a dev dependency, needed only to rebuild pb/.
    import grpc_tools
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    out_dir.mkdir(parents=True, exist_ok=True)
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    code = protoc.main(["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
                        *protos])
    if code:
        return int(code)
    for path in [*out_dir.rglob("*_pb2.py"), *out_dir.rglob("*_pb2.pyi")]:
        text = re.sub(r"^from cairn\.", f"from {PACKAGE}.cairn.", path.read_text(), flags=re.M)
        path.write_text(text)
    for directory in [out_dir, *[d for d in out_dir.rglob("*") if d.is_dir() and d.name != "__pycache__"]]:
        (directory / "__init__.py").touch()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output directory (default: %(default)s)")
    return build(parser.parse_args(argv).out)


if __name__ == "__main__":
    sys.exit(main())
