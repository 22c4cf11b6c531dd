"""Serve a dev-stack ASGI app (fake Strava, fake Telegram, dev Voicy API) from a background thread.

One implementation for every HTTP fake, for two reasons beyond not writing it
three times:

* **Nagle.** uvicorn writes a response's headers and body in separate sends. With
  Nagle's algorithm on, the body then waits for the ACK of the headers, which a
  client's delayed ACK holds back ~40 ms: every keep-alive response after the
  first took 44 ms instead of 1.5 ms, and the "instant" fake Strava was the
  slowest part of the Cairn benchmark. asyncio sets ``TCP_NODELAY`` on an
  accepted socket only when the listener's ``proto`` is ``IPPROTO_TCP`` (a bare
  ``socket(AF_INET, SOCK_STREAM)`` has 0), so ``loopback_listener`` names the
  protocol *and* sets ``TCP_NODELAY`` on the listener, which accepted sockets
  inherit on Linux.
* **Readiness.** The socket is bound before the thread starts (the port is known,
  a clash raises here), and ``start()`` returns when uvicorn has finished its
  start-up: an event, not a port poll.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any

import uvicorn

from devstack.infra.services import listen_host

LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends an RST instead of a FIN
SERVER_START_TIMEOUT_S = 10.0
SERVER_STOP_TIMEOUT_S = 10.0


def loopback_listener(port: int = 0) -> socket.socket:
    """A TCP socket bound to ``port`` (0: a free port) on the listen address (loopback unless this
    process is a hosts rig's core host), whose connections skip Nagle."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((listen_host(), port))
    return sock


class _ReadyServer(uvicorn.Server):
    """uvicorn server that signals a thread event once it accepts connections."""

    def __init__(self, config: uvicorn.Config, ready: threading.Event) -> None:
        super().__init__(config)
        self._ready = ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self._ready.set()


class BackgroundServer:
    """``app`` on uvicorn in a daemon thread named ``name``, on ``127.0.0.1:port`` (0: a free port)."""

    def __init__(self, app: Any, name: str, port: int = 0, *,
                 start_timeout_s: float = SERVER_START_TIMEOUT_S,
                 stop_timeout_s: float = SERVER_STOP_TIMEOUT_S,
                 uvicorn_options: dict[str, Any] | None = None) -> None:
        self.app, self.name, self.port = app, name, port
        self.uvicorn_options = dict(uvicorn_options or {})  # e.g. ssl_certfile/ssl_keyfile (a fake on TLS)
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self._server: _ReadyServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> BackgroundServer:
        """Bind, serve, and return once uvicorn accepts connections (``port`` is then the bound one)."""
        sock = loopback_listener(self.port)
        self.port = sock.getsockname()[1]
        ready = threading.Event()
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                **self.uvicorn_options)
        self._server = _ReadyServer(config, ready)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=self.name, daemon=True)
        self._thread.start()
        if not ready.wait(self.start_timeout_s):
            sock.close()
            raise RuntimeError(f"{self.name} did not start within {self.start_timeout_s}s")
        return self

    def stop(self) -> None:
        """Ask uvicorn to exit and wait up to ``stop_timeout_s`` (a held request may outlive it)."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(self.stop_timeout_s)
            self._server = self._thread = None

    def connection_sockets(self) -> list[Any]:
        """The server side of the connections open right now (asyncio ``TransportSocket`` objects).

        For tests that check what the kernel does with them (``TCP_NODELAY``), not for I/O.
        """
        server = self._server
        if server is None:
            return []
        return [conn.transport.get_extra_info("socket") for conn in list(server.server_state.connections)]

    def hang_up(self, client: tuple[str, int] | None, *, reset: bool = False) -> bool:
        """Close the connection of ``client`` (a request's peer address) without an answer.

        What a keep-alive server does when its idle timer fires as a request arrives: a FIN
        (``reset=False``), or an RST (``reset=True``: it closed with the request still unread).
        Call it from the app, on the server's own loop. False if no such connection is open.
        """
        server = self._server
        if server is None or client is None:
            return False
        for conn in list(server.server_state.connections):
            if tuple(getattr(conn, "client", None) or ()) == tuple(client):
                if reset:
                    conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                                      LINGER_RESET)
                conn.transport.close()
                return True
        return False
