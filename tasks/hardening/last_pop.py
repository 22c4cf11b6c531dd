"""A stopping consumer's pending BRPOP ends before it pops; a message it already popped goes back, quietly."""

from __future__ import annotations

import logging
from typing import Any

import redis

log = logging.getLogger(__name__)

BRPOP = "BRPOP"


class HandBackLastPop:
    """Redis channel mixin: closing with a BRPOP pending ends it before it pops, and a message it
    popped already goes back to its list's head.

    A stopping worker sends no BRPOP any more (tasks/hardening/stop_consuming.py), but the one already sent
    waits on the server until a message arrives or its 1 s timeout ends, and a message that arrives
    meanwhile (beat's ``voicy.heartbeat`` every few seconds) was popped. kombu read that reply as the
    channel closed and, the consumer being cancelled, logged ``WARNING Requeuing undeliverable
    message for queue 'io': No consumers.`` before requeuing it: nothing lost, yet a WARNING on
    every stop. Here the pending BRPOP is unblocked first, so it pops nothing; one whose reply was
    already on the wire is undone: ``RPUSH`` to the very list ``BRPOP`` took it from, untouched, so
    it is the next message any consumer of that queue pops, as if the worker had never asked."""

    _in_poll: Any
    client: Any
    sep: str
    connection_errors: tuple[type[BaseException], ...]

    def close(self) -> None:
        if self._in_poll:
            self._hand_back_last_pop()
        super().close()  # type: ignore[misc]

    def _hand_back_last_pop(self) -> None:
        connection = self.client.connection
        try:
            self._unblock(connection)
            reply = self.client.parse_response(connection, BRPOP)
            if reply:
                key, item = reply
                with self.conn_or_acquire() as client:  # type: ignore[attr-defined]
                    client.rpush(key, item)
                queue = (key.decode() if isinstance(key, bytes) else key).rsplit(self.sep, 1)[0]
                log.info("handed back a message for queue %r that arrived as the consumer stopped", queue)
        except self.connection_errors:
            connection.disconnect()  # as kombu's own read: the next use reconnects
        finally:
            self._in_poll = None

    def _unblock(self, connection: Any) -> None:
        """End the pending BRPOP now (``CLIENT UNBLOCK``: it answers as if timed out) rather than wait
        up to its 1 s timeout: that wait was most of an idle worker's stop. The connection is found by
        its local address; behind a proxy, or where ACLs refuse ``CLIENT``, the BRPOP just times out."""
        sock = getattr(connection, "_sock", None)
        try:
            host, port = sock.getsockname()[:2] if sock is not None else (None, None)
            if host is None:
                return
            with self.conn_or_acquire() as client:  # type: ignore[attr-defined]
                for entry in client.client_list():
                    if entry.get("addr") == f"{host}:{port}":
                        client.client_unblock(entry["id"])
                        return
        except (OSError, redis.ResponseError):
            return
