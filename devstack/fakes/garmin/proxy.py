"""A CONNECT proxy on loopback that tunnels the fake Garmin's host names to the fake's TLS port.

This is how the pool reaches the fake without touching ``/etc/hosts`` or
patching garth: ``CAIRN_GARMIN_PROXY_URL`` makes garth's requests session (and
its OAuth-consumer fetch, which reuses the session's proxies) open
``CONNECT sso.garmin.com:443`` here; the proxy answers 200 and relays bytes
both ways to the fake's HTTPS server, which then sees the ordinary TLS
handshake and ``Host`` header. A host the fake does not serve gets 403, so a
request meant for the real internet fails loudly instead of leaking out.
"""

from __future__ import annotations

import select
import socket
import socketserver
import threading
from collections.abc import Collection

from devstack.infra.services import listen_host

HEAD_LIMIT_BYTES = 16 * 1024
RELAY_CHUNK_BYTES = 64 * 1024
RELAY_IDLE_TIMEOUT_S = 60.0
CONNECT_PORT = 443


class _Handler(socketserver.BaseRequestHandler):
    server: ConnectProxy

    def handle(self) -> None:
        client: socket.socket = self.request
        head = b""
        while b"\r\n\r\n" not in head and len(head) < HEAD_LIMIT_BYTES:
            chunk = client.recv(4096)
            if not chunk:
                return
            head += chunk
        method, target, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        host, _, port = target.rpartition(":")
        if method != "CONNECT" or host not in self.server.hosts or port != str(CONNECT_PORT):
            client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        self.server.tunnels.append(host)
        with socket.create_connection((listen_host(), self.server.upstream_port)) as upstream:
            self.server.open_sockets.update((client, upstream))
            try:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                rest = head.split(b"\r\n\r\n", 1)[1]
                if rest:
                    upstream.sendall(rest)
                _relay(client, upstream)
            finally:
                self.server.open_sockets.difference_update((client, upstream))


def _relay(a: socket.socket, b: socket.socket) -> None:
    peers = {a: b, b: a}
    while True:
        readable, _, _ = select.select(list(peers), [], [], RELAY_IDLE_TIMEOUT_S)
        if not readable:
            return
        for sock in readable:
            try:
                data = sock.recv(RELAY_CHUNK_BYTES)
                if not data:
                    return
                peers[sock].sendall(data)
            except OSError:  # either side went away (a client closing a keep-alive connection)
                return


class ConnectProxy(socketserver.ThreadingTCPServer):
    """``CONNECT <host>:443`` for ``hosts`` → ``<listen address>:<upstream_port>`` (loopback unless a hosts
    rig's core host); a free port of its own."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, hosts: Collection[str], upstream_port: int) -> None:
        super().__init__((listen_host(), 0), _Handler)
        self.hosts, self.upstream_port = frozenset(hosts), upstream_port
        self.tunnels: list[str] = []  # the host of every tunnel opened (tests: traffic went through us)
        self.open_sockets: set[socket.socket] = set()  # closed at stop, so the upstream server can exit
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{listen_host()}:{self.server_address[1]}"

    def start(self) -> ConnectProxy:
        self._thread = threading.Thread(target=self.serve_forever, name="fake-garmin-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting and cut every open tunnel (a pooled keep-alive would hold uvicorn open)."""
        self.shutdown()
        self.server_close()
        for sock in list(self.open_sockets):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
