"""A worker's broker reconnect: tried again at least every 10 s, however long Redis was away."""

from __future__ import annotations

import functools
from typing import Any

RECONNECT_INTERVAL_START_S = 2.0  # kombu's own first wait
RECONNECT_INTERVAL_STEP_S = 2.0  # kombu's own growth per try
# The longest wait between two tries: with a try's connect bounded by workers.dead_peers.CONNECT_TIMEOUT_S
# (3 s), a worker connects again within 13 s of Redis answering, inside its HEAL_BOUND_S (15 s).
RECONNECT_INTERVAL_MAX_S = 10.0


class CappedReconnect:
    """Consumer mixin: the worker's broker reconnect waits at most ``RECONNECT_INTERVAL_MAX_S`` between tries.

    Celery's consumer reconnects through kombu's ``ensure_connection`` with kombu's defaults, the wait
    growing by 2 s a try up to 30 s. After Redis has been away for a minute or more (a restart, a
    failover, maintenance), a worker could then sit idle for up to 30 s with Redis back, where the
    bridges and beat try again within 10 s (``workers.outage.LOOP_BACKOFF_MAX_S``). The first waits
    stay kombu's, so a short outage is retried as quickly as before.
    """

    def ensure_connected(self, conn: Any) -> Any:
        # Celery calls ``conn.ensure_connection(errback, max_retries, callback=…)`` with no waits, so they
        # are bound on this connection; each reconnect builds a new connection and passes here again.
        conn.ensure_connection = functools.partial(
            type(conn).ensure_connection, conn, interval_start=RECONNECT_INTERVAL_START_S,
            interval_step=RECONNECT_INTERVAL_STEP_S, interval_max=RECONNECT_INTERVAL_MAX_S)
        return super().ensure_connected(conn)  # type: ignore[misc]
