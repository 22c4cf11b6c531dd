"""Restartable infrastructure for the chaos harness: Redis with an AOF, and restarts in place.

``services.start_redis`` runs Redis without persistence (tests flush it anyway).
A restart test needs what production runs: an append-only file, so a restarted
Redis comes back with the broker queues, results and leases it held. A restart
keeps the port and the data directory (nats-server's JetStream store included),
so every client reconnects to the same address, as after a platform restart.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from deploy.devstack import services

AOF_FSYNC = "everysec"  # production's usual choice (docs/operations.md); a SIGTERM restart loses nothing
RESTART_STOP_TIMEOUT_S = 10.0


def start_redis_aof(workdir: Path, port: int | None = None) -> services.Service:
    """redis-server on loopback with ``appendonly yes`` in ``workdir`` and ``noeviction``."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or services.free_port()
    proc = subprocess.Popen(
        [services.find_binary("redis-server"), "--bind", "127.0.0.1", "--port", str(port),
         "--save", "", "--appendonly", "yes", "--appendfsync", AOF_FSYNC,
         "--maxmemory-policy", "noeviction", "--dir", str(workdir), "--protected-mode", "yes"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    services.wait_for_port(port, proc)
    return services.Service("redis", f"redis://127.0.0.1:{port}/0", port, proc, workdir)


def restart_in_place(svc: services.Service, down_s: float,
                     start: Callable[[Path, int], services.Service]) -> services.Service:
    """SIGTERM ``svc`` (Redis writes its AOF, NATS its store), stay down ``down_s``, start it again
    on the same port and directory; returns the new service (same URL)."""
    assert svc.proc is not None and svc.workdir is not None
    svc.proc.terminate()
    try:
        svc.proc.wait(RESTART_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        svc.proc.kill()
        svc.proc.wait()
    time.sleep(down_s)  # the outage itself: a duration, not a wait for an event
    return start(svc.workdir, svc.port)


def start_nats_in(workdir: Path, port: int) -> services.Service:
    """``services.start_nats`` with the (workdir, port) signature ``restart_in_place`` calls."""
    return services.start_nats(workdir, port)
