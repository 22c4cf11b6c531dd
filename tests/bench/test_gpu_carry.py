"""The GPU kit over a lent GPU's calls: cut into carries under the limit, and put back together on arrival."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bench.gpu_carry import (
    CALL_LIMIT_BYTES,
    CARRY_LIMIT_BYTES,
    CUBLAS_LINKS,
    HOME_ENV,
    MANIFEST,
    MIB,
    CarryError,
    arrive,
    assemble,
    bench_env,
    carry_limit,
    cublas13_dir,
    exclude_from_git,
    main,
    missing,
    pack,
    plan,
    tracked_bytes,
)

LIMIT = 64 * 1024  # a small kit against a small limit: the same cuts as 167 MB against 60 MiB
HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _wheel(folder: Path, name: str, padding: int) -> Path:
    """A real wheel pip installs offline: one module, and ``padding`` incompressible bytes beside it."""
    files = {f"{name}/__init__.py": f"VALUE = {name!r}\n".encode(), f"{name}/pad.bin": os.urandom(padding),
             f"{name}-1.0.data/purelib/{name}_extra.py": b"EXTRA = True\n",  # goes on the path too
             f"{name}-1.0.data/scripts/{name}-tool": b"#!/bin/sh\n",  # no import needs it
             f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{name}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                            b"Tag: py3-none-any\n"}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for path, data in files.items()) + f"{name}-1.0.dist-info/RECORD,,\n"
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as whl:
        for member, data in {**files, f"{name}-1.0.dist-info/RECORD": record.encode()}.items():
            whl.writestr(member, data)
    return path


@pytest.fixture()
def kit(tmp_path: Path) -> Path:
    """What bench/gpu_pack.sh writes, small: wheels, the model's tar in parts, the corpus, the Python."""
    root = tmp_path / "kit"
    (root / "wheels").mkdir(parents=True)
    (root / "wheels" / "pins.txt").write_text("probe_big==1.0\nprobe_small==1.0\n")
    _wheel(root / "wheels", "probe_big", 40 * 1024)
    _wheel(root / "wheels", "probe_small", 2 * 1024)
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.bin").write_bytes(os.urandom(100 * 1024))
    (model / "config.json").write_text("{}")
    subprocess.run(["tar", "-cf", str(tmp_path / "model.tar"), "-C", str(tmp_path), "model"], check=True)
    data = (tmp_path / "model.tar").read_bytes()
    for index, start in enumerate(range(0, len(data), 30 * 1024)):
        (root / f"model.tar.part-a{chr(97 + index)}").write_bytes(data[start:start + 30 * 1024])
    (root / "corpus" / "voices").mkdir(parents=True)
    (root / "corpus" / "corpus.json").write_text(json.dumps({"voices": ["v1"]}))
    (root / "corpus" / "voices" / "v1.wav").write_bytes(os.urandom(9 * 1024))
    (root / "python-version").write_text(HERE + "\n")
    return root


def test_the_plan_uses_the_fewest_carries_keeps_wheels_whole_and_cuts_streams_in_order() -> None:
    rows = plan({"ct2.whl": 40, "av.whl": 34, "small.whl": 8}, {"corpus.tar": 9, "model.tar": 72}, limit=62)
    carries = {carry for _, carry, _, _ in rows}
    assert carries == {1, 2, 3}
    for carry in carries:
        assert sum(size for _, c, _, size in rows if c == carry) <= 62
    assert sorted((name, size) for name, _, _, size in rows if name.endswith(".whl")) == \
        [("av.whl", 34), ("ct2.whl", 40), ("small.whl", 8)]
    for stream, size in (("corpus.tar", 9), ("model.tar", 72)):
        cuts = [(offset, length) for name, _, offset, length in rows if name == stream]
        assert [offset for offset, _ in cuts] == [sum(length for _, length in cuts[:i]) for i in range(len(cuts))]
        assert sum(length for _, length in cuts) == size
    assert {carry for name, carry, _, _ in rows if name.endswith(".whl")} == {1, 2}
    assert len(plan({"a.whl": 10}, {"model.tar": 20}, limit=62)) == 2  # one carry is enough: one call


def test_a_kit_the_calls_cannot_hold_is_refused_with_its_sizes() -> None:
    with pytest.raises(CarryError, match=r"the kit is 0\.0 MiB: 3 carries of 0 MiB do not hold it"):
        plan({"ct2.whl": 40}, {"model.tar": 160}, limit=62)
    with pytest.raises(CarryError, match="largest wheel"):
        plan({"huge.whl": 70 * MIB}, {}, limit=62 * MIB)


def test_packed_carries_stay_under_the_limit_and_arrive_back_into_the_same_kit(kit: Path, tmp_path: Path) -> None:
    """Each call carries one folder, which is gone at the next: what arrived is kept in the home alone."""
    carries = pack(kit, tmp_path / "gpu-carry", limit=LIMIT)
    assert len(carries) == 3
    for folder in carries:
        assert sum(p.stat().st_size for p in folder.iterdir() if p.name != MANIFEST) <= LIMIT
    home = tmp_path / "home"
    arrivals = []
    for folder in carries:
        device_copy = tmp_path / "device" / folder.name  # the host's copy of this call's folder alone
        shutil.copytree(folder, device_copy)
        arrivals.append(arrive(device_copy, home))
        last = device_copy
        if folder is not carries[-1]:
            shutil.rmtree(device_copy)
            assert missing(home) == arrivals[-1].missing
    assert [a.complete for a in arrivals] == [False, False, True]
    assert arrivals[0].missing and set(arrivals[1].missing) < set(arrivals[0].missing)
    shutil.rmtree(last)  # a later call (another run) names no carried folder: the home alone serves it
    assert missing(home) == ()
    model, corpus = assemble(home)
    assert (model / "model.bin").read_bytes() == (tmp_path / "model" / "model.bin").read_bytes()
    assert (corpus / "voices" / "v1.wav").read_bytes() == (kit / "corpus" / "voices" / "v1.wav").read_bytes()
    libs = tmp_path / "torch-venv" / "nvidia" / "cu13" / "lib"
    libs.mkdir(parents=True)
    for target in CUBLAS_LINKS.values():
        (libs / target).write_bytes(b"")  # where the host's torch venv keeps cuBLAS 13
    found = cublas13_dir({}, roots=[tmp_path / "torch-venv" / "nvidia"])
    assert found == libs
    env = bench_env(home, tmp_path, {"PATH": os.environ["PATH"]}, found)
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[:2] == [str(home / "cuda12-names"), str(libs)]
    for name, target in CUBLAS_LINKS.items():
        assert (home / "cuda12-names" / name).resolve() == libs / target
    out = subprocess.run([sys.executable, "-c", "import probe_big, probe_small, probe_big_extra; "
                          "print(probe_big.VALUE, probe_big_extra.EXTRA)"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["probe_big", "True"]
    assert not list((home / "site").rglob("*-tool")) and not list((home / "site").glob("*.data"))


def test_a_piece_cut_short_is_named_and_not_counted(kit: Path, tmp_path: Path) -> None:
    first = pack(kit, tmp_path / "gpu-carry", limit=LIMIT)[0]
    piece = next(p for p in sorted(first.iterdir()) if p.name != MANIFEST)
    piece.write_bytes(piece.read_bytes()[:-1])
    with pytest.raises(CarryError, match=rf"carry-1: {piece.name} is \d+ bytes, packed \d+ bytes"):
        arrive(first, tmp_path / "home")
    assert not (tmp_path / "home" / "arrived.json").exists()


def test_wheels_for_another_python_are_refused_before_anything_installs(kit: Path, tmp_path: Path) -> None:
    (kit / "python-version").write_text("3.99\n")
    first = pack(kit, tmp_path / "gpu-carry", limit=LIMIT)[0]
    with pytest.raises(CarryError, match=rf"for Python 3\.99, this host runs {HERE}: .*PYTHON_VERSION={HERE}"):
        arrive(first, tmp_path / "home")
    assert not (tmp_path / "home").exists()


def test_a_home_left_by_another_kit_is_emptied(kit: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "arrived.json").write_text(json.dumps({"kit": "another", "arrived": ["model.tar.01"]}))
    (home / "stale").write_text("x")
    arrival = arrive(pack(kit, tmp_path / "gpu-carry", limit=LIMIT)[2], home)
    assert not (home / "stale").exists() and not arrival.complete
    assert "model.tar.01" not in json.loads((home / "arrived.json").read_text())["arrived"]


def test_the_carry_folder_is_listed_in_git_exclude_once(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    for _ in range(2):
        exclude_from_git(tmp_path, tmp_path / "gpu-carry")
    assert (tmp_path / ".git" / "info" / "exclude").read_text().splitlines() == ["/gpu-carry/"]
    exclude_from_git(tmp_path, Path("/elsewhere/gpu-carry"))  # outside the repository: nothing to list
    assert (tmp_path / ".git" / "info" / "exclude").read_text().splitlines() == ["/gpu-carry/"]


def test_a_carry_leaves_the_call_room_for_the_repository_copy(tmp_path: Path) -> None:
    """60 MiB a carry while the tracked files fit the other 4 MiB; past that, a carry shrinks with them."""
    assert carry_limit(tracked_bytes(tmp_path)) == CARRY_LIMIT_BYTES  # not a repository: no tracked files to read
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "code.py").write_bytes(b"x" * MIB)
    (tmp_path / "untracked.bin").write_bytes(b"x" * 8 * MIB)  # never carried: not in the repository copy
    subprocess.run(["git", "-C", str(tmp_path), "add", "code.py"], check=True)
    assert carry_limit(tracked_bytes(tmp_path)) == CARRY_LIMIT_BYTES
    (tmp_path / "fixture.bin").write_bytes(b"x" * 4 * MIB)
    subprocess.run(["git", "-C", str(tmp_path), "add", "fixture.bin"], check=True)
    limit = carry_limit(tracked_bytes(tmp_path))
    assert limit < CARRY_LIMIT_BYTES and limit + 5 * MIB < CALL_LIMIT_BYTES


def test_a_run_before_every_carry_arrived_names_what_is_missing(kit: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    assert main(["run", "--device", "cuda", "--repeats", "3"]) == 2
    assert "lacks carry-1: arrive every carry first" in capsys.readouterr().err
    first = pack(kit, tmp_path / "gpu-carry", limit=LIMIT)[0]
    assert main(["arrive", str(first), "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("carry 1 of 3 installed in ") and "model.tar." in out
    assert main(["run", "--device", "cuda"]) == 2
    assert "model.tar." in capsys.readouterr().err


def test_a_real_cublas_12_is_left_alone(tmp_path: Path) -> None:
    """With CUDA 12 on the host, its own libcublas.so.12 serves CTranslate2: no cuBLAS 13 under its name."""
    probe = [sys.executable, "-c", "from bench.gpu_carry import cublas12_loads; print(cublas12_loads())"]
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}  # whether this machine has one is its own business
    (tmp_path / "empty.c").write_text("int cublas_stub;\n")  # an empty library the loader finds by that name
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libcublas.so.12"), str(tmp_path / "empty.c")],
                   check=True)
    env["LD_LIBRARY_PATH"] = str(tmp_path)
    assert subprocess.run(probe, env=env, capture_output=True, text=True, check=True).stdout.split() == ["True"]
