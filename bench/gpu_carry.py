"""The GPU kit cut into carried folders of at most 64 MiB, and each one's arrival on a lent GPU host."""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.util
import io
import json
import os
import shutil
import site
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

MIB = 1024 * 1024
# How a lent GPU is used (bench/gpu_kit.md): it runs one command per call, with at most 64 MiB of
# carried files, and stays warm about 30 s between calls. ``pack`` cuts the kit of bench/gpu_pack.sh
# into carry-1 … carry-N; each call runs ``arrive`` on its folder, and the call that brings the last
# piece runs ``python -m bench gpu``. Standard library only: it runs before anything is installed.
# A lent GPU takes at most 64 MiB a call, and the repository copy may travel with each call: a carry
# holds at most 60 MiB, less as the tracked files grow past what the other 4 MiB hold (``carry_limit``).
CALL_LIMIT_BYTES = 64 * MIB
CARRY_LIMIT_BYTES = 60 * MIB
MANIFEST_ROOM_BYTES = 64 * 1024  # one carry's manifest: every piece's name, size and SHA-256 (about 5 KiB)
# It stays warm about 30 s between calls, so the kit must arrive in a few calls issued back to back.
MAX_CARRIES = 3
CARRY_DIR = "gpu-carry"  # in the repository, listed in .git/info/exclude: carried, never committed
MANIFEST = "carry.json"
STREAMS = ("corpus.tar", "model.tar")  # cut anywhere, joined in this order's pieces on arrival
WHEEL = "wheel"
# The host keeps what arrived here, outside the repository copy: a carried folder that the next call
# does not name again is removed there, while this folder lasts as long as the machine stays warm.
HOME_ENV = "SWITCHYARD_GPU_HOME"
DEFAULT_HOME = Path(tempfile.gettempdir()) / "switchyard-gpu"
CUBLAS13_ENV = "CUBLAS13_DIR"  # where libcublas.so.13 lies, if the search below does not find it
# CTranslate2's PyPI wheel opens cuBLAS 12 by these names; with CUDA 13 only, cuBLAS 13 answers to them.
CUBLAS12 = "libcublas.so.12"
CUBLAS_LINKS = {CUBLAS12: "libcublas.so.13", "libcublasLt.so.12": "libcublasLt.so.13"}
DEFAULT_BENCH_ARGS = ("--device", "cuda")
# faster-whisper's own imports that the kit leaves to the host unless built with EXTRA=1 (a GPU image
# usually has them): each arrival says at once which are missing, before the last call is spent.
HOST_PACKAGES = ("numpy", "tokenizers", "onnxruntime", "huggingface_hub")
HASH_CHUNK_BYTES = MIB
LIBRARY_SCHEMES = ("purelib", "platlib")  # a wheel's .data folders whose files go on the path


class CarryError(Exception):
    """The kit does not fit the calls, or what arrived is not what was packed: the message says which."""


@dataclass(frozen=True)
class Piece:
    """One carried file: a whole wheel, or a slice of a stream starting at ``offset``."""

    name: str
    kind: str  # WHEEL or a stream's name
    carry: int  # 1-based
    size: int
    sha256: str
    offset: int = 0


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _streams(kit: Path, work: Path) -> dict[str, Path]:
    """The kit's corpus folder as one tar, and its model parts joined back into one tar."""
    corpus = work / "corpus.tar"
    with tarfile.open(corpus, "w") as tar:
        tar.add(kit / "corpus", arcname="corpus")
    model = work / "model.tar"
    parts = sorted(kit.glob("model.tar.part-*"))
    if not parts:
        raise CarryError(f"{kit} holds no model.tar.part-*: build the kit with bench/gpu_pack.sh first")
    with model.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                shutil.copyfileobj(f, out)
    return {"corpus.tar": corpus, "model.tar": model}


def plan(wheels: dict[str, int], streams: dict[str, int], limit: int = CARRY_LIMIT_BYTES,
         max_carries: int = MAX_CARRIES) -> list[tuple[str, int, int, int]]:
    """Where each byte goes: ``(name, carry, offset, size)`` rows, wheels whole (largest first, into
    the first carry with room), then each stream in order, cut to fill the carries one after another.
    The fewest carries that hold it all; more than ``max_carries`` is a CarryError with the sizes."""
    total = sum(wheels.values()) + sum(streams.values())
    for count in range(max(1, -(-total // limit)), max_carries + 1):
        free, rows = [limit] * count, []
        for name, size in sorted(wheels.items(), key=lambda item: -item[1]):
            carry = next((i for i, room in enumerate(free) if room >= size), None)
            if carry is None:
                break
            free[carry] -= size
            rows.append((name, carry + 1, 0, size))
        else:
            for name, size in streams.items():
                offset = 0
                for carry, room in enumerate(free):
                    take = min(room, size - offset)
                    if take > 0:
                        rows.append((name, carry + 1, offset, take))
                        free[carry] -= take
                        offset += take
                if offset < size:
                    break
            else:
                return rows
    raise CarryError(f"the kit is {total / MIB:.1f} MiB: {max_carries} carries of {limit / MIB:.0f} MiB do not "
                     f"hold it (largest wheel {max(wheels.values(), default=0) / MIB:.1f} MiB)")


def pack(kit: Path, into: Path, limit: int = CARRY_LIMIT_BYTES, max_carries: int = MAX_CARRIES) -> list[Path]:
    """Cut the kit ``bench/gpu_pack.sh`` built into ``into/carry-1`` … ``carry-N``, each with the manifest."""
    pins = (kit / "wheels" / "pins.txt")
    python = (kit / "python-version").read_text().strip() if (kit / "python-version").is_file() else ""
    wheels = {p.name: p.stat().st_size for p in sorted((kit / "wheels").glob("*.whl"))}
    if not wheels or not pins.is_file():
        raise CarryError(f"{kit} holds no wheels: build the kit with bench/gpu_pack.sh first")
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="sy-carry-") as tmp:
        streams = _streams(kit, Path(tmp))
        rows = plan(wheels, {name: path.stat().st_size for name, path in streams.items()}, limit, max_carries)
        count = max(carry for _, carry, _, _ in rows)
        pieces: list[Piece] = []
        for index, (name, carry, offset, size) in enumerate(rows):
            folder = into / f"carry-{carry}"
            folder.mkdir(exist_ok=True)
            if name in wheels:
                target = folder / name
                shutil.copyfile(kit / "wheels" / name, target)
                pieces.append(Piece(name, WHEEL, carry, size, _sha256(target)))
                continue
            target = folder / f"{name}.{index:02d}"
            with streams[name].open("rb") as src, target.open("wb") as dst:
                src.seek(offset)
                dst.write(src.read(size))
            pieces.append(Piece(target.name, name, carry, size, _sha256(target), offset))
    for carry in range(1, count + 1):
        manifest = {"carry": carry, "carries": count, "python": python, "pieces": [asdict(p) for p in pieces]}
        (into / f"carry-{carry}" / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return [into / f"carry-{carry}" for carry in range(1, count + 1)]


def tracked_bytes(repo: Path) -> int | None:
    """The size of the repository copy a call carries (the tracked files), or None without git."""
    try:
        listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum((repo / name).stat().st_size for name in listed.decode().split("\0") if name and (repo / name).is_file())


def carry_limit(tracked: int | None) -> int:
    """What one carry may hold beside ``tracked`` bytes of repository copy (:func:`tracked_bytes`): 60 MiB,
    or less if a call's 64 MiB less the copy and a manifest's room is less (unknown copy: 60 MiB)."""
    return CARRY_LIMIT_BYTES if tracked is None else min(CARRY_LIMIT_BYTES,
                                                         CALL_LIMIT_BYTES - tracked - MANIFEST_ROOM_BYTES)


def exclude_from_git(repo: Path, into: Path) -> None:
    """List ``into`` in the repository's ``.git/info/exclude`` (carried, never committed)."""
    try:
        relative = into.resolve().relative_to(repo.resolve())
    except ValueError:
        return  # outside the repository: nothing to exclude
    exclude = repo / ".git" / "info" / "exclude"
    line = f"/{relative.as_posix()}/"
    if not (repo / ".git").is_dir() or (exclude.is_file() and line in exclude.read_text().splitlines()):
        return
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with exclude.open("a") as f:
        f.write(line + "\n")


# --------------------------------------------------------------------------- on the GPU host
@dataclass(frozen=True)
class Arrival:
    """What one call brought, what the kit still lacks, and what the host lacks that the kit left out."""

    carry: int
    carries: int
    missing: tuple[str, ...]
    host_lacks: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return not self.missing


def _kit_id(manifest: dict) -> str:
    return hashlib.sha256(json.dumps(manifest["pieces"], sort_keys=True).encode()).hexdigest()[:16]


def arrive(carried: Path, home: Path) -> Arrival:
    """Check the pieces of ``carried`` against its manifest, unpack its wheels into ``home/site`` and
    keep its stream pieces in ``home/pieces``. A home left by another kit is emptied first."""
    manifest = json.loads((carried / MANIFEST).read_text())
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if manifest["python"] and manifest["python"] != here:
        raise CarryError(f"the wheels are for Python {manifest['python']}, this host runs {here}: "
                         f"build the kit again with PYTHON_VERSION={here} sh bench/gpu_pack.sh")
    state_file, kit = home / "arrived.json", _kit_id(manifest)
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    if state.get("kit") != kit:
        shutil.rmtree(home, ignore_errors=True)
        state = {"kit": kit, "arrived": []}
    (home / "pieces").mkdir(parents=True, exist_ok=True)
    mine = [Piece(**p) for p in manifest["pieces"] if p["carry"] == manifest["carry"]]
    for piece in mine:
        path = carried / piece.name
        size = path.stat().st_size if path.is_file() else None
        if size != piece.size or _sha256(path) != piece.sha256:
            raise CarryError(f"carry-{piece.carry}: {piece.name} is {size} bytes, packed {piece.size} bytes "
                             "with another checksum: the call did not carry it whole")
    for piece in mine:
        if piece.kind == WHEEL:
            unpack_wheel(carried / piece.name, home / "site")
        else:
            shutil.copyfile(carried / piece.name, home / "pieces" / piece.name)
    state["arrived"] = sorted(set(state["arrived"]) | {p.name for p in mine})
    state_file.write_text(json.dumps(state))
    shutil.copyfile(carried / MANIFEST, home / MANIFEST)  # for later runs, once no carried folder is left
    lacks = tuple(name for name in HOST_PACKAGES if importlib.util.find_spec(name) is None
                  and not (home / "site" / name).is_dir())
    return Arrival(manifest["carry"], manifest["carries"], missing(home), lacks)


def unpack_wheel(wheel: Path, site_dir: Path) -> None:
    """Install ``wheel`` as ``pip install --no-deps --target`` would for imports: its root goes on the
    path, and a ``.data`` folder's ``purelib``/``platlib`` too. Unzipped here, so the host needs no
    pip (a lent host's interpreter may have none) and no index."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            top, _, rest = member.filename.partition("/")
            if top.endswith(".data"):
                scheme, _, rest = rest.partition("/")
                if scheme not in LIBRARY_SCHEMES or not rest:
                    continue  # scripts, headers, data: nothing an import needs
                member.filename = rest
            archive.extract(member, site_dir)


def missing(home: Path) -> tuple[str, ...]:
    """The pieces of the kit that have not arrived in ``home`` (all of them: no carry arrived yet)."""
    if not (home / MANIFEST).is_file():
        return ("carry-1",)
    arrived = set(json.loads((home / "arrived.json").read_text())["arrived"])
    return tuple(p["name"] for p in json.loads((home / MANIFEST).read_text())["pieces"] if p["name"] not in arrived)


def assemble(home: Path) -> tuple[Path, Path]:
    """Join each stream's pieces and unpack it: the model directory and the corpus folder."""
    pieces = [Piece(**p) for p in json.loads((home / MANIFEST).read_text())["pieces"]]
    for stream in STREAMS:
        joined = io.BytesIO()
        for piece in sorted((p for p in pieces if p.kind == stream), key=lambda p: p.offset):
            joined.write((home / "pieces" / piece.name).read_bytes())
        joined.seek(0)
        target = home / stream.removesuffix(".tar")
        shutil.rmtree(target, ignore_errors=True)
        with tarfile.open(fileobj=joined) as tar:
            if hasattr(tarfile, "data_filter"):  # Python 3.11.4+: refuse links and paths out of the target
                tar.extractall(target, filter="data")
            else:
                tar.extractall(target)
    model = next((p.parent for p in sorted((home / "model").rglob("model.bin"))), None)
    if model is None:
        raise CarryError(f"no model.bin in the model that arrived ({home / 'model'})")
    return model, home / "corpus" / "corpus"


def cublas12_loads() -> bool:
    """Whether the loader finds a real ``libcublas.so.12`` (CUDA 12 installed): then it is used as it is,
    and cuBLAS 13 is not put in its place."""
    try:
        ctypes.CDLL(CUBLAS12)
    except OSError:
        return False
    return True


def cublas13_dir(environ: dict[str, str], roots: list[Path] | None = None) -> Path | None:
    """Where libcublas.so.13 lies: ``CUBLAS13_DIR``, else the interpreter's site-packages (a torch
    venv's ``nvidia/cu13/lib``), else the CUDA toolkit's usual folders. None: not found."""
    if environ.get(CUBLAS13_ENV):
        return Path(environ[CUBLAS13_ENV])
    if roots is None:
        roots = [Path(p) / "nvidia" for p in site.getsitepackages()] + sorted(Path("/usr/local").glob("cuda*"))
    for root in roots:
        found = sorted(root.rglob("libcublas.so.13")) if root.is_dir() else []
        if found:
            return found[0].parent
    return None


def bench_env(home: Path, repo: Path, environ: dict[str, str], cublas13: Path | None) -> dict[str, str]:
    """The bench's environment: the arrived wheels and the repository first on the path, and cuBLAS 13
    under the cuBLAS 12 names on the loader's path (read once, at the process's start)."""
    env = dict(environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(home / "site"), str(repo), environ.get("PYTHONPATH")]))
    if cublas13 is not None:
        links = home / "cuda12-names"
        links.mkdir(exist_ok=True)
        for name, target in CUBLAS_LINKS.items():
            (links / name).unlink(missing_ok=True)
            (links / name).symlink_to(cublas13 / target)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(links), str(cublas13),
                                                               environ.get("LD_LIBRARY_PATH")]))
    return env


def run_bench(home: Path, repo: Path, args: list[str]) -> int:
    """Unpack what arrived and run ``python -m bench gpu`` on it; its output also goes to a file in ``home``."""
    model, corpus = assemble(home)
    cublas13 = None if cublas12_loads() else cublas13_dir(dict(os.environ))
    print(f"cuBLAS 13 from {cublas13} under the .so.12 names" if cublas13 else "the loader's own cuBLAS (no "
          f"libcublas.so.13 put in its place; set {CUBLAS13_ENV}= if CTranslate2 cannot open {CUBLAS12})", flush=True)
    out = home / f"bench-gpu-{socket.gethostname()}-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    command = [sys.executable, "-m", "bench", "gpu", "--model", str(model), "--corpus", str(corpus), *args]
    with subprocess.Popen(command, cwd=repo, env=bench_env(home, repo, dict(os.environ), cublas13),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc, out.open("w") as log:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
    print(f"figures in {out}")
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_carry", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    packing = sub.add_parser("pack", help="cut a kit bench/gpu_pack.sh built into carried folders")
    packing.add_argument("kit", type=Path)
    packing.add_argument("--into", type=Path, default=Path(CARRY_DIR))
    packing.add_argument("--limit-mib", type=float, help="one carry's limit (default: 60, less if the "
                         "repository's tracked files and a manifest leave less of a call's 64)")
    arriving = sub.add_parser("arrive", help="on the GPU host: install one carried folder; the last runs the bench")
    arriving.add_argument("carried", type=Path)
    arriving.add_argument("bench_args", nargs=argparse.REMAINDER, help="bench gpu's options (default: --device cuda)")
    # Another run on the kit already in the home, in a later call while the host is warm (e.g. with
    # OMP_NUM_THREADS=$(nproc) for the spin comparison): no carried folder needed.
    sub.add_parser("run", help="on the GPU host: run the bench again on the kit that arrived, with bench gpu's "
                               "options (default: --device cuda)")
    args, extra = parser.parse_known_args(argv)  # run's options are all bench gpu's: argparse cannot name them
    if extra and args.command == "pack":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    repo = Path(__file__).resolve().parents[1]
    try:
        if args.command == "pack":
            tracked = tracked_bytes(repo)
            limit = int(args.limit_mib * MIB) if args.limit_mib else carry_limit(tracked)
            carries = pack(args.kit, args.into, limit)
            exclude_from_git(repo, args.into)
            copy = tracked or 0
            for folder in carries:
                size = sum(p.stat().st_size for p in folder.iterdir())
                print(f"{folder}: {size / MIB:.1f} MiB, {(size + copy) / MIB:.1f} MiB with the repository copy "
                      f"(a call takes {CALL_LIMIT_BYTES / MIB:.0f})")
            return 0
        home = Path(os.environ.get(HOME_ENV) or DEFAULT_HOME)
        if args.command == "arrive":
            arrival = arrive(args.carried, home)
            if arrival.host_lacks:
                print(f"this host lacks {', '.join(arrival.host_lacks)}, which faster-whisper imports: build the "
                      "kit with EXTRA=1 sh bench/gpu_pack.sh", file=sys.stderr)
            if not arrival.complete:
                print(f"carry {arrival.carry} of {arrival.carries} installed in {home}; still to come: "
                      + ", ".join(arrival.missing))
                return 0
        elif lacking := missing(home):
            raise CarryError(f"the kit in {home} lacks {', '.join(lacking)}: arrive every carry first")
        given = [*getattr(args, "bench_args", []), *extra]
        bench_args = [a for a in given if a != "--"] or list(DEFAULT_BENCH_ARGS)
        return run_bench(home, repo, bench_args)
    except CarryError as exc:
        print(f"bench gpu_carry: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
