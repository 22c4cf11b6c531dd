"""How soon a connection across a silent cut (packets dropped, no RST) is given up, for every client."""

from __future__ import annotations

import socket

# The documented bound (docs/RELIABILITY.md): every process type works again this soon after a silent
# cut of its host heals. The settings below are what keeps it.
HEAL_BOUND_S = 15.0

# Data sent and not acknowledged for this long aborts the connection (Linux ``TCP_USER_TIMEOUT``).
# Why: across a cut the kernel retransmits with exponential backoff, so after the heal a connection
# that was sending waits for its next retransmission, as long again as the cut had lasted (a 45 s cut
# left a gpu host silent 54 s after the heal). Aborted instead, the client reconnects on a fresh
# connection at once. A live peer's kernel acknowledges within milliseconds however loaded it is.
TCP_USER_TIMEOUT_S = 10.0
# An idle connection is probed after this long, every KEEPALIVE_INTERVAL_S, and dropped after
# KEEPALIVE_PROBES unanswered probes: a connection that only waits (a BRPOP, a subscription) is
# found dead within 5 + 3 x 2 = 11 s of the cut, as one that sends is by TCP_USER_TIMEOUT_S.
KEEPALIVE_IDLE_S = 5
KEEPALIVE_INTERVAL_S = 2
KEEPALIVE_PROBES = 3
# redis-py PINGs a pooled connection idle this long before using it; kombu also drops a BRPOP whose
# reply is overdue by its 1 s timeout plus this (kombu's default, 25 s, left 26 s).
REDIS_HEALTH_CHECK_INTERVAL_S = 5.0
# How long a connect may wait for the peer's answer before the client tries again (a SYN into a cut
# is retransmitted at 1, 3, 7, 15 s: without a bound the first try after the heal waits for it).
CONNECT_TIMEOUT_S = 3.0
# NATS: a PING every NATS_PING_INTERVAL_S, the connection stale once NATS_MAX_OUTSTANDING_PINGS go
# unanswered (nats-py's defaults, 120 s and 2, took four minutes); nats-py then reconnects.
NATS_PING_INTERVAL_S = 5
NATS_MAX_OUTSTANDING_PINGS = 2


def tcp_options() -> dict[int, int]:
    """``IPPROTO_TCP`` options for a client socket (redis-py's ``socket_keepalive_options``)."""
    options = {socket.TCP_KEEPIDLE: KEEPALIVE_IDLE_S, socket.TCP_KEEPINTVL: KEEPALIVE_INTERVAL_S,
               socket.TCP_KEEPCNT: KEEPALIVE_PROBES}
    user_timeout = getattr(socket, "TCP_USER_TIMEOUT", None)  # Linux only; elsewhere keepalive alone
    if user_timeout is not None:
        options[user_timeout] = int(TCP_USER_TIMEOUT_S * 1000)
    return options


def redis_options() -> dict[str, object]:
    """redis-py connection keyword arguments: keepalive, the user timeout, health checks, connect bound."""
    return {"socket_keepalive": True, "socket_keepalive_options": tcp_options(),
            "health_check_interval": REDIS_HEALTH_CHECK_INTERVAL_S, "socket_connect_timeout": CONNECT_TIMEOUT_S}


def socket_options() -> list[tuple[int, int, int]]:
    """The same as ``(level, option, value)`` triples (httpx's and httpcore's ``socket_options``)."""
    return [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
            *((socket.IPPROTO_TCP, option, value) for option, value in tcp_options().items())]
