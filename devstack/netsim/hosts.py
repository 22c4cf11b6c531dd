"""Several hosts on one machine: Linux network namespaces joined by veth pairs to one switch (R2).

``Network.create(names)`` makes, for this run only (names carry the run's pid and
a random tag):

* a switch namespace holding a bridge, and one namespace per host, each with one
  veth (``eth0``, an address on ``SUBNET``) whose peer is a port of the bridge.
  The whole network lives inside these namespaces, so nothing of the machine's
  own network changes and runs never see each other;
* ``Host.argv`` runs a command *on* a host: in its network namespace, with its
  own hostname (UTS namespace), its own pid numbering (pid namespace: pool
  processes on two hosts have the same pids, as on two machines), and its own
  ``/tmp`` and ``/dev/shm`` (mount namespace). The repository is mounted
  read-only: a process can read the installed software, as on any host, but the
  only storage two hosts share is what they reach over the network (S3);
* ``Network.enter(host)`` moves this (single-threaded) process onto a host: the
  partition harness runs the core's services in-process and must sit on core.

Partitions (honest ones: packets are dropped, so TCP hangs instead of failing
fast): ``cut``/``heal`` take a host's link down and up at the switch;
``drop``/``undrop`` drop one host's TCP to one service by nftables
(``devstack.netsim.netfilter``). ``destroy()`` removes every namespace of the run;
``sweep_stale()`` removes those of runs whose process died without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUBNET = "10.77.0"  # private to the run's namespaces: the machine's routes never see it
PREFIX_LEN = 24
FIRST_HOST_OCTET = 10
BRIDGE = "br0"
NAME_PREFIX = "sy"
_NAME = re.compile(rf"^{NAME_PREFIX}(\d+)r([0-9a-f]+)-")
IP_TIMEOUT_S = 30.0  # one `ip` or nft call; far above what any takes
CLONE_NEWNET = 0x40000000
CLONE_NEWUTS = 0x04000000
# Runs inside the host's fresh namespaces, then execs the command. The repository is held open (fd 9)
# before the host's own disk covers /tmp, and mounted back read-only from that fd: a checkout under
# /tmp (``git clone . "$(mktemp -d)"``) was hidden by the new /tmp ("mount point does not exist").
# ``--no-canonicalize`` keeps mount from resolving the fd's path, which now names the covered place.
HOST_SETUP = (
    'hostname "$1" && exec 9<"$3" && mount --bind "$2" /tmp && mount -t tmpfs tmpfs /dev/shm'
    ' && mkdir -p "$3" && mount --no-canonicalize --bind "/proc/$$/fd/9" "$3"'
    ' && mount --no-canonicalize -o remount,bind,ro "$3" && exec 9<&- && shift 3 && exec "$@"')


class HostsError(RuntimeError):
    """Setting up or partitioning the hosts failed (the ``ip`` command's own message)."""


def ip(*args: str, netns: str | None = None) -> str:
    """Run ``ip [-n netns] args``; its stdout, or ``HostsError`` with its stderr."""
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise HostsError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Host:
    """One machine of the rig: a name (also its hostname), its namespace, address and own disk."""

    name: str
    netns: str
    address: str
    disk: Path  # the host's /tmp, as seen from outside it

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run on this host (exec all the way down: the pid the caller holds is ``unshare``,
        whose only child is the command, killed with it)."""
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--mount", "--pid", "--fork",
                "--kill-child", "--mount-proc", "--propagation", "private", "--",
                "bash", "-c", HOST_SETUP, self.name, self.name, str(self.disk), str(ROOT), *argv]


@dataclass
class Network:
    """The run's switch and hosts; ``destroy()`` (or the context manager) removes them all."""

    run: str = field(default_factory=lambda: f"{NAME_PREFIX}{os.getpid()}r{secrets.token_hex(2)}")
    hosts: dict[str, Host] = field(default_factory=dict)
    _made: list[str] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{self.run}-sw"

    def create(self, names: list[str], disk_root: Path) -> Network:
        """The switch and one host per name (addresses in order from ``.10``), each with a disk under
        ``disk_root``. On any failure whatever was made is removed before the error propagates."""
        try:
            self._netns(self.switch)
            ip("link", "add", BRIDGE, "type", "bridge", netns=self.switch)
            ip("link", "set", BRIDGE, "up", netns=self.switch)
            for i, name in enumerate(names):
                self._add_host(name, f"{SUBNET}.{FIRST_HOST_OCTET + i}", disk_root / name)
        except BaseException:
            self.destroy()
            raise
        return self

    def _netns(self, name: str) -> None:
        ip("netns", "add", name)
        self._made.append(name)

    def _add_host(self, name: str, address: str, disk: Path) -> None:
        netns = f"{self.run}-{name}"
        port = f"v-{name}"[:15]
        self._netns(netns)
        ip("link", "add", "eth0", "netns", netns, "type", "veth", "peer", "name", port, "netns", self.switch)
        ip("link", "set", port, "master", BRIDGE, "up", netns=self.switch)
        ip("addr", "add", f"{address}/{PREFIX_LEN}", "dev", "eth0", netns=netns)
        ip("link", "set", "eth0", "up", netns=netns)
        ip("link", "set", "lo", "up", netns=netns)
        disk.mkdir(parents=True, exist_ok=True)
        self.hosts[name] = Host(name, netns, address, disk)

    # --- partitions ------------------------------------------------------------------------------
    def cut(self, host: str) -> None:
        """Take the host's link down at the switch: everything it sends or is sent is dropped."""
        ip("link", "set", f"v-{host}"[:15], "down", netns=self.switch)

    def heal(self, host: str) -> None:
        ip("link", "set", f"v-{host}"[:15], "up", netns=self.switch)

    def cut_silently(self, host: str) -> None:
        """Drop everything ``host`` sends to or receives from the other hosts (nftables, in its own
        namespace), its link up. Why besides :meth:`cut`: with its link down a host's own kernel knows
        (no carrier) and retries its sends within half a second of the heal, which a partition behind
        a failed switch or router never tells it. :meth:`undrop` heals it."""
        self._netfilter(host, "isolate", f"{SUBNET}.0/{PREFIX_LEN}")

    def drop(self, host: str, peer: str, port: int) -> None:
        """Drop ``host``'s TCP to and from ``peer:port`` (nftables, in the host's namespace)."""
        self._netfilter(host, "drop", peer, str(port))

    def undrop(self, host: str) -> None:
        """Heal every drop of ``host``."""
        self._netfilter(host, "clear")

    def _netfilter(self, host: str, *args: str) -> None:
        argv = ["ip", "netns", "exec", self.hosts[host].netns, sys.executable, "-m", "devstack.netsim.netfilter",
                *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S, cwd=ROOT, check=False)
        if done.returncode != 0:
            raise HostsError(f"netfilter {' '.join(args)} on {host}: {done.stderr.strip()[-500:]}")

    # --- this process ----------------------------------------------------------------------------
    def enter(self, host: str) -> None:
        """Move this process onto ``host``: its network namespace and a UTS namespace named after it.

        A network namespace belongs to a thread, so this must run before the process starts any
        thread; every thread and child started afterwards lives on the host.
        """
        if threading.active_count() != 1:
            raise HostsError("enter() needs a single-threaded process (a namespace is per thread)")
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{self.hosts[host].netns}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise HostsError(f"setns to {host}: {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(fd)
        if libc.unshare(CLONE_NEWUTS) != 0:
            raise HostsError(f"unshare UTS: {os.strerror(ctypes.get_errno())}")
        socket.sethostname(host)

    # --- teardown --------------------------------------------------------------------------------
    def destroy(self) -> None:
        """Remove every namespace of the run (their veths go with them), killing what still runs in them."""
        for netns in reversed(self._made):
            remove_netns(netns)
        self._made.clear()
        self.hosts.clear()

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def remove_netns(netns: str) -> None:
    """SIGKILL what still runs in ``netns`` (only processes this run started live there; never this
    process, which may sit on the host it removes), then delete it."""
    with contextlib.suppress(HostsError, subprocess.TimeoutExpired):
        for pid in ip("netns", "pids", netns).split():
            if int(pid) != os.getpid():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
    with contextlib.suppress(HostsError, subprocess.TimeoutExpired):
        ip("netns", "delete", netns)


def sweep_stale() -> list[str]:
    """Remove the namespaces of earlier runs whose process is gone (a run SIGKILLed before its
    ``destroy``); returns their names. A live run's namespaces are never touched."""
    removed = []
    for line in ip("netns", "list").splitlines():
        netns = line.split()[0] if line.strip() else ""
        match = _NAME.match(netns)
        if match and not _alive(int(match.group(1))):
            remove_netns(netns)
            removed.append(netns)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def network(names: list[str], disk_root: Path) -> Iterator[Network]:
    """A fresh network of ``names``, removed on the way out whatever happened."""
    sweep_stale()
    net = Network().create(names, disk_root)
    try:
        yield net
    finally:
        net.destroy()
