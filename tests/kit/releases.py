"""The releases CHANGELOG.md records, and fleet processes run from the previous release's own tree."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from devstack.infra.procs import STOP_TIMEOUT_S, Proc
from tests.kit.celery_worker import CeleryWorker

ROOT = Path(__file__).resolve().parents[2]
CHANGELOG = ROOT / "CHANGELOG.md"
PROBE = Path(__file__).with_name("release_probe.py")
# What a process of another release needs from its tree, those of these its commit has: its packages
# (the dev stack's moved from deploy/ to devstack/) and its declared dependencies.
CHECKOUT_PATHS = ("tasks", "workers", "bridges", "ops", "deploy", "devstack", "pyproject.toml")
GIT_TIMEOUT_S = 60.0
_ENTRY = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>.+))?$", re.MULTILINE)
_COMMIT = re.compile(r"^Commit: `(?P<commit>[0-9a-f]{40})`$", re.MULTILINE)


@dataclass(frozen=True)
class Release:
    version: str
    commit: str | None  # None: not released yet (the top entry)


def releases(text: str | None = None) -> list[Release]:
    """Every entry of the changelog, newest first, with the commit a released one names."""
    text = CHANGELOG.read_text() if text is None else text
    heads = list(_ENTRY.finditer(text))
    found = []
    for head, following in zip(heads, [*heads[1:], None], strict=True):
        body = text[head.end():following.start() if following else len(text)]
        commit = _COMMIT.search(body)
        found.append(Release(head["version"], commit["commit"] if commit else None))
    return found


def previous_release() -> Release:
    """The release this tree upgrades from: the newest entry below the top one that names its commit."""
    released = [r for r in releases()[1:] if r.commit]
    assert released, f"{CHANGELOG.name} names no released commit below its top entry"
    return released[0]


def checkout(release: Release, dest: Path) -> Path:
    """``release``'s tree (its packages and pyproject) from this clone's own history, under ``dest``."""
    assert release.commit is not None, release
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{release.commit}^{{commit}}"],
                           capture_output=True, timeout=GIT_TIMEOUT_S)
    assert known.returncode == 0, (f"commit {release.commit} of release {release.version} is not in this clone's "
                                   "history (a shallow clone? the test needs the full history of main)")
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", release.commit],
                            capture_output=True, text=True, check=True, timeout=GIT_TIMEOUT_S).stdout.split()
    paths = [path for path in CHECKOUT_PATHS if path in listed]
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", release.commit, *paths],
                             capture_output=True, check=True, timeout=GIT_TIMEOUT_S)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def unmet_requirements(tree: Path) -> list[str]:
    """The tree's declared dependencies this interpreter's environment does not satisfy."""
    declared = tomllib.loads((tree / "pyproject.toml").read_text())["project"]["dependencies"]
    unmet = []
    for spec in declared:
        req = Requirement(spec)
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{spec} (not installed)")
            continue
        if not req.specifier.contains(installed, prereleases=True):
            unmet.append(f"{spec} (installed {installed})")
    return unmet


def command(tree: Path, module: str, *args: str) -> list[str]:
    """``python -m <module> args`` with ``tree``'s code first (through the probe, which says so)."""
    return [sys.executable, str(PROBE), str(tree), module, *args]


def spawn_from(tree: Path, args: list[str], env: dict[str, str], log_path: Path, *,
               stop_timeout_s: float = STOP_TIMEOUT_S) -> Proc:
    """``devstack.infra.procs.spawn`` with ``tree`` as the working directory (its Procfile-relative paths)."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(args, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return Proc(proc, log_path, stop_timeout_s)


class ReleaseWorker(CeleryWorker):
    """A ``celery -A tasks worker`` of the release whose tree is ``tree``; stopped and read as the kit's workers."""

    def __init__(self, tree: Path, queues: str, env: dict[str, str], log_path: Path, *, name: str,
                 concurrency: int = 1) -> None:
        self.queues, self.log_path, self.name = queues, log_path, name
        args = command(tree, "celery", "-A", "tasks", "worker", "-Q", queues, "-P", "prefork",
                       "-c", str(concurrency), "-n", name, "-l", "INFO", "--without-mingle", "--without-gossip")
        self.proc = spawn_from(tree, args, env, log_path).proc
