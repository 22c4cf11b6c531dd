"""A partition by nftables DROP, in the network namespace this runs in (``ip netns exec NS python -m ...``).

``drop PEER PORT`` makes this host's TCP to ``PEER:PORT`` (and everything from it)
vanish: packets are dropped, not rejected, so a connection hangs and a connect
times out, as on a real network partition. A REJECT (or a closed port) answers at
once and tests nothing a partition does. ``clear`` heals every drop of the host.

The rules live in one table of the host's own namespace (``TABLE``), written over
netlink with pyroute2: no ``nft`` or ``iptables`` binary needed (the dev box has
neither), only the kernel's nf_tables. Equivalent ``nft`` rules::

    table ip sy_partition {
      chain out { type filter hook output priority 0; ip daddr PEER tcp dport PORT drop }
      chain in  { type filter hook input priority 0;  ip saddr PEER tcp sport PORT drop }
    }
"""

from __future__ import annotations

import argparse
import contextlib
import struct
import sys
from collections import OrderedDict
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.nftables.expressions import genex, ipv4addr, verdict
from pyroute2.nftables.main import NFTables

TABLE = "sy_partition"
CHAINS = {"out": "output", "in": "input"}
NF_DROP = 0
NF_ACCEPT = 1
IPPROTO_TCP = 6
NFT_META_L4PROTO = 16
NFT_PAYLOAD_TRANSPORT_HEADER = 2
SRC_PORT_OFFSET, DST_PORT_OFFSET = 0, 2  # in the TCP header
ENOENT = 2


def _tcp() -> list[dict[str, Any]]:
    """``meta l4proto tcp``."""
    meta = OrderedDict(dreg=1, key=NFT_META_L4PROTO)
    cmp = OrderedDict(sreg=1, op=0, data={"attrs": [("NFTA_DATA_VALUE", bytes([IPPROTO_TCP]))]})
    return [genex("meta", meta), genex("cmp", cmp)]


def _port(offset: int, port: int) -> list[dict[str, Any]]:
    """``tcp sport|dport PORT`` (network byte order)."""
    load = OrderedDict(dreg=1, base=NFT_PAYLOAD_TRANSPORT_HEADER, offset=offset, len=2)
    cmp = OrderedDict(sreg=1, op=0, data={"attrs": [("NFTA_DATA_VALUE", struct.pack("!H", port))]})
    return [genex("payload", load), genex("cmp", cmp)]


def drop(peer: str, port: int) -> None:
    """Drop this host's TCP traffic to and from ``peer:port``, both ways."""
    nft = NFTables()
    try:
        with contextlib.suppress(NetlinkError):  # already there: another drop on this host
            nft.table("add", name=TABLE)
        for chain, hook in CHAINS.items():
            with contextlib.suppress(NetlinkError):
                nft.chain("add", table=TABLE, name=chain, hook=hook, type="filter", policy=NF_ACCEPT)
        nft.rule("add", table=TABLE, chain="out",
                 expressions=(ipv4addr(dst=peer), _tcp(), _port(DST_PORT_OFFSET, port), verdict(NF_DROP)))
        nft.rule("add", table=TABLE, chain="in",
                 expressions=(ipv4addr(src=peer), _tcp(), _port(SRC_PORT_OFFSET, port), verdict(NF_DROP)))
    finally:
        nft.close()


def isolate(subnet: str) -> None:
    """Drop every IP packet between this host and ``subnet`` (``10.77.0.0/24``), both ways: the host's
    link stays up, so its kernel sees no carrier loss, only silence, as behind a failed router."""
    nft = NFTables()
    try:
        with contextlib.suppress(NetlinkError):
            nft.table("add", name=TABLE)
        for chain, hook in CHAINS.items():
            with contextlib.suppress(NetlinkError):
                nft.chain("add", table=TABLE, name=chain, hook=hook, type="filter", policy=NF_ACCEPT)
        nft.rule("add", table=TABLE, chain="out", expressions=(ipv4addr(dst=subnet), verdict(NF_DROP)))
        nft.rule("add", table=TABLE, chain="in", expressions=(ipv4addr(src=subnet), verdict(NF_DROP)))
    finally:
        nft.close()


def clear() -> None:
    """Remove every drop of this host (no table: nothing to heal)."""
    nft = NFTables()
    try:
        nft.table("del", name=TABLE)
    except NetlinkError as exc:
        if exc.code != ENOENT:
            raise
    finally:
        nft.close()


def rules() -> int:
    """How many drop rules the host holds now (what a test checks after ``clear``)."""
    nft = NFTables()
    try:
        return sum(1 for r in nft.get_rules() if r.get_attr("NFTA_RULE_TABLE") == TABLE)
    finally:
        nft.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.netsim.netfilter",
                                     description="partition this network namespace by nftables DROP")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add = sub.add_parser("drop", help="drop TCP to and from PEER:PORT")
    add.add_argument("peer")
    add.add_argument("port", type=int)
    whole = sub.add_parser("isolate", help="drop every packet to and from SUBNET")
    whole.add_argument("subnet")
    sub.add_parser("clear", help="remove every drop")
    sub.add_parser("count", help="print how many drop rules there are")
    args = parser.parse_args(argv)
    if args.cmd == "drop":
        drop(args.peer, args.port)
    elif args.cmd == "isolate":
        isolate(args.subnet)
    elif args.cmd == "clear":
        clear()
    else:
        print(rules())
    return 0


if __name__ == "__main__":
    sys.exit(main())
