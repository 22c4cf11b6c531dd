"""A message popped by a BRPOP still in flight when the consumer's channel closes goes back, quietly."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

BRPOP = "BRPOP"


class HandBackLastPop:
    """Redis channel mixin: closing with a BRPOP in flight puts its message back at its list's head.

    A stopping worker sends no BRPOP any more (tasks/stop_consuming.py), but the one already sent
    waits on the server until a message arrives or its 1 s timeout ends, and a message that arrives
    meanwhile (beat's ``voicy.heartbeat`` every few seconds) is popped. kombu reads that reply as the
    channel closes and, the consumer being cancelled, logs ``WARNING Requeuing undeliverable message
    for queue 'io': No consumers.`` before requeuing it: nothing lost, yet a WARNING on every stop.
    The pop cannot be taken back on the server (the reply may be on the wire), so this undoes it:
    ``RPUSH`` to the very list ``BRPOP`` took it from, untouched, so it is the next message any
    consumer of that queue pops, as if the stopping worker had never asked."""

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
