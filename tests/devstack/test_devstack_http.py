"""The dev stack's HTTP fakes answer keep-alive requests without Nagle delays.

uvicorn writes a response's headers and body separately; without ``TCP_NODELAY``
on the accepted socket, every keep-alive response after the first waits ~40 ms
for the client's delayed ACK, and the "instant" fake Strava becomes the slowest
part of the Cairn benchmark (docs/BENCHMARKS.md). The check reads the socket
option on the server's side of a live keep-alive connection: a timing check
would flake on a loaded machine, the option does not.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from devstack.fakes.http_server import BackgroundServer, loopback_listener
from devstack.fakes.strava import FakeStrava
from devstack.fakes.telegram import FakeTelegram
from devstack.fakes.voicy_api import DevVoicyServer

KEEPALIVE_REQUESTS = 3  # the delay hit the second and later responses on one connection
REQUEST_TIMEOUT_S = 5.0


def _nodelay(sock: Any) -> bool:
    return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


# Each fake, and where its HTTP root is once started.
FAKES: dict[str, tuple[Callable[[], Any], Callable[[Any], str]]] = {
    "strava": (FakeStrava, lambda fake: fake.base_url),
    "telegram": (lambda: FakeTelegram("123:nodelay-test-token"), lambda fake: fake.url),
    "voicy": (DevVoicyServer, lambda fake: fake.base_url),
}


@pytest.mark.parametrize("kind", sorted(FAKES))
def test_accepted_connections_of_every_fake_have_tcp_nodelay(kind: str) -> None:
    make, root = FAKES[kind]
    fake = make().start()
    try:
        assert isinstance(fake.http, BackgroundServer)
        with httpx.Client(base_url=root(fake), timeout=REQUEST_TIMEOUT_S) as client:
            for _ in range(KEEPALIVE_REQUESTS):
                client.get("/nodelay-probe")  # any answer will do (404s included): the connection is the point
            server_side = fake.http.connection_sockets()
            assert len(server_side) == 1, f"expected one keep-alive connection, saw {len(server_side)}"
            assert _nodelay(server_side[0]), f"{kind}: Nagle is on for an accepted connection"
    finally:
        fake.stop()


def test_loopback_listener_is_tcp_with_nodelay() -> None:
    """What accepted sockets inherit (Linux) and what asyncio checks before setting it itself."""
    with loopback_listener() as sock:
        assert sock.getsockname()[0] == "127.0.0.1" and sock.getsockname()[1] > 0
        assert sock.proto == socket.IPPROTO_TCP
        assert _nodelay(sock)
