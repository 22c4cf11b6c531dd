"""Ports for dev-stack services: below the kernel's ephemeral range, one block per pytest-xdist worker.

Why not ``bind(0)``: the kernel hands out ephemeral ports, and it hands a port
out again as soon as it is free. The outage tests kill a Redis or nats-server
and keep its port free for seconds while the fleet keeps reconnecting to it.
In that window another xdist worker's ``bind(0)`` could be given the same port
and start its own service there, and the fleet under test would talk to
another test's Redis. A CI run saw something this would explain, though no
other test's log named the port: a Cairn bridge reported "Redis available
again" 0.6 s into a 4 s outage of its Redis.

So every process allocates from its own block of ports (the xdist worker's
number picks the block; a process outside xdist, such as the demo, a bench run
or pytest without ``-n``, uses block 0), walks it in order from a random start (a
port it handed out comes round again only after the whole block), and checks each with a ``bind`` before handing it out.
The blocks lie below the ephemeral range, so no outgoing connection's source
port can take a service's port either.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import re
import socket
from pathlib import Path

FIRST_PORT = 10_000  # above the well-known and most registered service ports
LAST_PORT_CAP = 32_767  # the default ephemeral range starts at 32768 (net.ipv4.ip_local_port_range)
BLOCKS = 24  # xdist workers 0..22 get their own block (block 0: outside xdist); more wrap around
MIN_BLOCK_PORTS = 200  # a block this small (a narrowed port range) falls back to the kernel's choice
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
XDIST_WORKER = re.compile(r"gw(\d+)$")

_cursor: dict[tuple[str, int], itertools.cycle[int]] = {}


@functools.cache  # read once per process: free_port() asks on every call
def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return LAST_PORT_CAP + 1


def block_index(worker: str | None = None) -> int:
    """This process's block: 1 + the xdist worker's number (``PYTEST_XDIST_WORKER=gw3`` → 4), else 0."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "") if worker is None else worker
    match = XDIST_WORKER.match(worker)
    return (1 + int(match.group(1))) % BLOCKS if match else 0


def block(index: int) -> range | None:
    """The ports of block ``index``, or None if the range below the ephemeral ports is too narrow."""
    last = min(LAST_PORT_CAP, ephemeral_low() - 1)
    size = (last - FIRST_PORT + 1) // BLOCKS
    if size < MIN_BLOCK_PORTS:
        return None
    start = FIRST_PORT + index * size
    return range(start, start + size)


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_port(host: str) -> int:
    """A port on ``host`` that nothing is bound to, from this process's block, never the same twice
    in a row: the walk goes on from the last port handed out. It starts at a random place, so two
    runs that share a machine and a block (say CI and a developer's run) walk apart: a walk seeded by
    the pid made three runs started together pick the same ports within a second."""
    index = block_index()
    ports = block(index)
    if ports is None:
        return _kernel_port(host)
    key = (host, index)
    if key not in _cursor:
        offset = random.SystemRandom().randrange(len(ports))
        _cursor[key] = itertools.cycle([*ports[offset:], *ports[:offset]])
    walk = _cursor[key]
    for _ in range(len(ports)):
        port = next(walk)
        if _bindable(host, port):
            return port
    return _kernel_port(host)  # every port of the block is taken: let the kernel choose
