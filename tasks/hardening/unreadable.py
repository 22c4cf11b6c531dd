"""A broker item that is not a kombu message is set aside in ``<queue>.unreadable``, not fatal."""

from __future__ import annotations

import logging
from queue import Empty
from typing import Any

from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from tasks.hardening.last_pop import BRPOP

log = logging.getLogger(__name__)

UNREADABLE_SUFFIX = ".unreadable"  # the list an unreadable item of queue ``io`` goes to: ``io.unreadable``


class SetAsideUnreadable:
    """Redis channel mixin: an item popped from a queue that is not a JSON object is pushed, exactly as
    popped, onto its queue's ``.unreadable`` list and logged at ERROR, and the consumer goes on.

    kombu decodes each popped item inside its BRPOP read; an item that is not JSON raised there,
    Celery called the error unrecoverable and the worker exited, its prefetched tasks restored and
    the item gone. Anything with write access to Redis can push such bytes. This is kombu 5.7's
    ``Channel._brpop_read`` with the decode guarded; tests/fleet/test_redisconn.py fails when kombu's
    changes, and tests/voicy/test_voicy_e2e.py feeds the workers hostile items.
    """

    client: Any
    connection: Any
    connection_errors: tuple[type[BaseException], ...]
    sep: str
    _in_poll: Any
    _queue_cycle: Any

    def _brpop_read(self, **options: Any) -> bool:
        try:
            try:
                reply = self.client.parse_response(self.client.connection, BRPOP, **options)
            except self.connection_errors:
                self.client.connection.disconnect()  # the next iteration reconnects
                raise
            if not reply:
                raise Empty()
            key, item = reply
            queue = bytes_to_str(key).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(queue)
            try:
                message = loads(bytes_to_str(item))
            except ValueError as exc:  # not JSON (bytes that are not UTF-8 arrive replaced, so not JSON either)
                self._set_aside(queue, item, f"{type(exc).__name__}: {exc}")
                raise Empty() from None
            if not isinstance(message, dict):
                self._set_aside(queue, item, f"JSON {type(message).__name__}, not an object")
                raise Empty()
            self.connection._deliver(message, queue)
            return True
        finally:
            self._in_poll = None
            flush = getattr(self, "_flush_brpop_reauth", None)  # kombu 5.7: a pending re-auth goes now
            if flush is not None:
                flush()

    def _set_aside(self, queue: str, item: bytes, cause: str) -> None:
        aside = f"{queue}{UNREADABLE_SUFFIX}"
        with self.conn_or_acquire() as client:  # type: ignore[attr-defined]
            client.lpush(aside, item)
        log.error("queue %r: an item that is not a task message (%s, %d bytes) was set aside in %r",
                  queue, cause[:120], len(item), aside)
