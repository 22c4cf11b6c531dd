"""A Redis Sentinel topology on loopback: one master, one replica, three Sentinels."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from devstack.infra.services import Service, find_binary, free_port, listen_host, start_redis, wait_for_port

SENTINEL_MASTER_NAME = "switchyard"
SENTINEL_QUORUM = 2  # of three sentinels
SENTINEL_DOWN_AFTER_MS = 1000  # loopback: a master silent this long is down
SENTINEL_FAILOVER_TIMEOUT_MS = 5000
SENTINEL_KILL_PAUSE_MS = 10_000  # writes held on the master while its replica catches up, before the kill
TOPOLOGY_READY_TIMEOUT_S = 30.0
TOPOLOGY_POLL_INTERVAL_S = 0.1


def start_sentinel(master_port: int, workdir: Path, port: int | None = None,
                   master_name: str = SENTINEL_MASTER_NAME) -> Service:
    """Start one Sentinel (``redis-server <conf> --sentinel``) monitoring the master on ``master_port``.

    Sentinel rewrites its configuration file as it learns the topology, so each
    one gets its own file in ``workdir``.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    conf = workdir / f"sentinel-{port}.conf"
    conf.write_text("\n".join([
        f"port {port}", f"bind {listen_host()}", f"dir {workdir}",
        f"sentinel monitor {master_name} {listen_host()} {master_port} {SENTINEL_QUORUM}",
        f"sentinel down-after-milliseconds {master_name} {SENTINEL_DOWN_AFTER_MS}",
        f"sentinel failover-timeout {master_name} {SENTINEL_FAILOVER_TIMEOUT_MS}",
        f"sentinel parallel-syncs {master_name} 1", ""]))
    proc = subprocess.Popen([find_binary("redis-server"), str(conf), "--sentinel"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, proc)
    return Service("sentinel", f"sentinel://{listen_host()}:{port}", port, proc, workdir)


@dataclass
class SentinelTopology:
    """One master, one replica, three Sentinels on loopback; ``url`` is what ``REDIS_URL`` names."""

    master: Service
    replica: Service
    sentinels: list[Service]
    master_name: str = SENTINEL_MASTER_NAME

    @property
    def url(self) -> str:
        """``sentinel://127.0.0.1:p1/0;sentinel://127.0.0.1:p2;...`` (kombu's spelling)."""
        first, *rest = self.sentinels
        return ";".join([f"{first.url}/0", *(s.url for s in rest)])

    def env(self) -> dict[str, str]:
        return {"REDIS_URL": self.url, "REDIS_SENTINEL_MASTER": self.master_name}

    def master_port(self) -> int | None:
        """The master's port as the Sentinels see it now (None while none agrees)."""
        for sentinel in self.sentinels:
            if sentinel.proc is None or sentinel.proc.poll() is not None:
                continue
            with contextlib.suppress(redis.RedisError):
                client = redis.Redis(host=listen_host(), port=sentinel.port, socket_timeout=1.0)
                try:
                    addr = client.execute_command("SENTINEL", "get-master-addr-by-name", self.master_name)
                finally:
                    client.close()
                if addr:
                    return int(addr[1])
        return None

    def wait_ready(self, timeout_s: float = TOPOLOGY_READY_TIMEOUT_S) -> None:
        """Block until the replica is in sync and every Sentinel knows the replica and the other two
        (without that, a failover cannot be authorised)."""
        def ready() -> bool:
            with contextlib.suppress(redis.RedisError):
                replica = redis.Redis(host=listen_host(), port=self.replica.port, socket_timeout=1.0)
                try:
                    if replica.info("replication").get("master_link_status") != "up":
                        return False
                finally:
                    replica.close()
                for sentinel in self.sentinels:
                    client = redis.Redis(host=listen_host(), port=sentinel.port, socket_timeout=1.0)
                    try:
                        if (len(client.execute_command("SENTINEL", "replicas", self.master_name)) < 1
                                or len(client.execute_command("SENTINEL", "sentinels", self.master_name))
                                < len(self.sentinels) - 1):
                            return False
                    finally:
                        client.close()
                return True
            return False

        _poll(ready, timeout_s, "the Sentinel topology to settle")

    def kill_master(self) -> None:
        """SIGKILL the current master (a crash, not a shutdown) once the replica holds every write the
        master acknowledged.

        Replication is asynchronous: a master killed while its replica lags loses its last acknowledged
        writes (docs/operations.md §2.4 documents that window), and on a loaded box the lag grows until a
        test's queued task or held record is among them, which no client of ours can notice. The tests
        prove that the fleet follows a failover, not Redis's window: so writes are paused on the master
        (``CLIENT PAUSE ... WRITE``: a writing client waits, unanswered, and sees the crash as an outage),
        the replica is awaited up to the master's offset, and only then is the master killed.
        """
        assert self.master.proc is not None
        master = redis.Redis(host=listen_host(), port=self.master.port, socket_timeout=1.0)
        replica = redis.Redis(host=listen_host(), port=self.replica.port, socket_timeout=1.0)
        try:
            master.execute_command("CLIENT", "PAUSE", SENTINEL_KILL_PAUSE_MS, "WRITE")
            offset = master.info("replication")["master_repl_offset"]
            _poll(lambda: replica.info("replication").get("slave_repl_offset", -1) >= offset,
                  SENTINEL_KILL_PAUSE_MS / 1000, "the replica to hold every write of the master")
        finally:
            master.close()
            replica.close()
        self.master.proc.kill()
        self.master.proc.wait()

    def wait_failover(self, timeout_s: float = TOPOLOGY_READY_TIMEOUT_S) -> None:
        """Block until the Sentinels name the replica as master."""
        _poll(lambda: self.master_port() == self.replica.port, timeout_s, "the Sentinels to promote the replica")

    def stop(self) -> None:
        for svc in [*self.sentinels, self.replica, self.master]:
            svc.stop()


def _poll(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(TOPOLOGY_POLL_INTERVAL_S)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")


def start_sentinel_topology(workdir: Path | None = None, sentinels: int = 3) -> SentinelTopology:
    """Master (AOF ``everysec``), replica and ``sentinels`` Sentinels on loopback, settled and ready."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="sy-sentinel-"))
    master = start_redis(workdir / "master", appendonly=True)
    replica = start_redis(workdir / "replica", appendonly=True, replicaof=master.port)
    watchers = [start_sentinel(master.port, workdir / f"sentinel-{i}") for i in range(sentinels)]
    topology = SentinelTopology(master, replica, watchers)
    try:
        topology.wait_ready()
    except BaseException:
        topology.stop()
        raise
    return topology


@contextlib.contextmanager
def sentinel_topology() -> Iterator[SentinelTopology]:
    topology = start_sentinel_topology()
    try:
        yield topology
    finally:
        topology.stop()
