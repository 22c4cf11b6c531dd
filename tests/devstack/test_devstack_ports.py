"""Dev-stack ports: each xdist worker has its own block below the ephemeral range, and a port freed
by a killed service is not handed out again while the fleet may still knock on it."""

from __future__ import annotations

import socket

from devstack.infra import ports
from devstack.infra.services import LOOPBACK


def test_each_xdist_worker_has_its_own_block_below_the_ephemeral_range() -> None:
    assert ports.block_index("") == 0  # the demo, a bench run, pytest without -n
    assert [ports.block_index(f"gw{n}") for n in range(3)] == [1, 2, 3]
    blocks = [ports.block(i) for i in range(ports.BLOCKS)]
    assert all(b is not None and len(b) >= ports.MIN_BLOCK_PORTS for b in blocks)
    seen: set[int] = set()
    for b in blocks:
        assert b is not None
        assert not seen & set(b)  # disjoint
        seen |= set(b)
        assert b.start >= ports.FIRST_PORT and b.stop - 1 < ports.ephemeral_low()


def test_a_freed_port_is_not_handed_out_again_and_a_bound_one_is_skipped() -> None:
    here = ports.block(ports.block_index())
    assert here is not None
    first = ports.free_port(LOOPBACK)
    assert first in here
    # a "service" holds the next port of the walk: it is skipped
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        nxt = first + 1 if first + 1 in here else here.start
        try:
            held.bind((LOOPBACK, nxt))
        except OSError:  # taken by something else already: skipped all the same
            pass
        handed = [ports.free_port(LOOPBACK) for _ in range(20)]
    assert nxt not in handed and first not in handed  # first is free again, yet not reused
    assert len(set(handed)) == len(handed)
    assert all(p in here for p in handed)
