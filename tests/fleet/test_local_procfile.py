"""The documented local run: ``make stack``, then ``honcho start`` in the activated venv, all up and healthy."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack import serve
from devstack.infra.procfile import entries
from devstack.infra.procs import Proc, spawn
from tests.kit.procfile import ROOT, SHELL, VENV_BIN
from tests.kit.waiting import wait_until

# What docs/operations.md §2.1 and deploy/README.md tell a user to type, word for word.
STACK_COMMAND = "make stack"
IGNORE_SIGINT = "trap '' INT;"  # what a non-interactive shell does to a command it runs in the background
ACTIVATE = ". .venv/bin/activate"
HONCHO_START = f"{ACTIVATE} && honcho start"
HEALTH = f"{ACTIVATE} && honcho run switchyard health"
DOCS = (ROOT / "docs" / "operations.md", ROOT / "deploy" / "README.md")

STACK_READY_S = 120.0
HEALTHY_S = 180.0
HEALTH_POLL_S = 2.0
HONCHO_STOP_S = 30.0  # honcho's own SIGKILL comes after 5 s; this only bounds a hang
VERB_TIMEOUT_S = 120.0
FLOWER_TIMEOUT_S = 5.0


def shell_env() -> dict[str, str]:
    """A new user's shell: no deployment variables, no CA bundle of the box's, the venv not on PATH."""
    drop = ("VOICY_", "CAIRN_", "AWS_", "FLOWER_", "HONCHO_", "DYNO", "PORT", "REDIS_")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != VENV_BIN)
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, "PATH": path}


def honcho(args: str, env_file: Path) -> str:
    """A documented honcho command; ``-e`` points it at this test's file instead of the checkout's ``.env``."""
    return args.replace("honcho ", f"honcho -e {env_file} ", 1)


@pytest.fixture()
def services(tmp_path: Path) -> Iterator[tuple[Proc, Path]]:
    """``make stack`` (``python -m devstack.serve``), writing this test's env file, until the test ends.

    Flower's port is the stack's own choice (``--port 0``): one this process chose would come from the
    same block of ports (``devstack.infra.ports``) as the stack's services, which might take it first.
    """
    env_file = tmp_path / "stack.env"
    # Started as a background command of a script is (SIGINT ignored, and inherited by make and the stack),
    # whatever the suite itself was started under: the Ctrl-C below must stop it all the same.
    proc = spawn([SHELL, "-c", f"{IGNORE_SIGINT} {STACK_COMMAND} ARGS='--env {env_file} --port 0'"],
                 shell_env(), tmp_path / "stack.out", stop_timeout_s=HONCHO_STOP_S)
    try:
        wait_until(lambda: "ready; press Ctrl-C" in proc.log() or proc.proc.poll() is not None, STACK_READY_S,
                   "make stack to be ready")
        assert proc.proc.poll() is None and env_file.is_file(), proc.log()[-3000:]
        yield proc, env_file
    finally:
        proc.stop(signal.SIGINT)  # Ctrl-C at the terminal: make and the stack get it (make then says so)
    assert not env_file.exists()  # its .env goes with the services it names
    assert "stack stopped" in proc.log() and "Traceback" not in proc.log(), proc.log()[-3000:]


@pytest.mark.slow
def test_make_stack_then_honcho_start_runs_every_procfile_process_healthy(services: tuple[Proc, Path],
                                                                           tmp_path: Path) -> None:
    _, env_file = services
    variables = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    run = spawn([SHELL, "-c", honcho(HONCHO_START, env_file)], shell_env(), tmp_path / "honcho.out",
                stop_timeout_s=HONCHO_STOP_S)
    try:
        def healthy() -> bool:
            assert run.proc.poll() is None, f"honcho stopped:\n{run.log()[-4000:]}"
            verdict = subprocess.run([SHELL, "-c", honcho(HEALTH, env_file)], cwd=ROOT, env=shell_env(),
                                     capture_output=True, text=True, timeout=VERB_TIMEOUT_S)
            return verdict.returncode == 0 and verdict.stdout.splitlines()[-1].startswith("HEALTHY: ")

        wait_until(healthy, HEALTHY_S, "a HEALTHY verdict", interval_s=HEALTH_POLL_S)
        started = {line.split("|")[1].split()[0] for line in run.log().splitlines() if " started (pid=" in line}
        assert started == {f"{name}.1" for name in entries()}, run.log()[-4000:]
        flower = httpx.get(f"http://127.0.0.1:{variables['PORT']}/api/tasks", timeout=FLOWER_TIMEOUT_S,
                           auth=(variables["FLOWER_USER"], variables["FLOWER_PASSWORD"]))
        assert flower.status_code == 200, flower.text
    finally:
        os.kill(run.proc.pid, signal.SIGTERM)  # honcho stops its processes itself (SIGTERM, SIGKILL after 5 s)
        run.proc.wait(HONCHO_STOP_S)
    out = run.log()
    assert "sending SIGKILL" not in out and "Traceback" not in out, out[-4000:]
    assert {line.split("|")[1].split()[0] for line in out.splitlines() if " stopped (rc=" in line} == \
        {f"{name}.1" for name in entries()}, out[-4000:]


def test_the_docs_give_the_tested_commands_word_for_word() -> None:
    for doc in DOCS:
        text = doc.read_text()
        for command in (STACK_COMMAND, HONCHO_START):
            assert command in text, f"{doc.name} does not say {command!r}"


def test_make_stack_never_replaces_an_env_file_it_did_not_write(tmp_path: Path) -> None:
    mine = tmp_path / ".env"
    mine.write_text("REDIS_URL=redis://prod.example:6379/0\n")
    assert serve.main(["--env", str(mine)]) == serve.EXIT_REFUSED
    assert mine.read_text() == "REDIS_URL=redis://prod.example:6379/0\n"
