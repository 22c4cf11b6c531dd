"""An ack lost with the broker connection is an outage line, not a CRITICAL with a traceback.

Celery acks a message as its task starts (early ack, ``tasks.settings``). When
Redis goes away at that instant (a restart, a Sentinel failover), kombu logs
``Couldn't ack '<tag>', reason: ...`` at CRITICAL with the connection error's
full traceback, from the worker's main process. Nothing is lost and nothing
needs an operator: the task runs anyway, and the message kombu keeps unacked
is either run by its job's recovery path (a Voicy job's lease and the grant
audit, ``workers.voicy.grants``; a Cairn job's NATS redelivery) or, restored
after the visibility timeout, finds its job's lease changed and does nothing.
So a *connection* error there becomes one WARNING line naming the message and
the error, like every other outage line (R1, H1); any other ack failure keeps
Celery's CRITICAL and traceback, because that one is news.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from kombu.exceptions import OperationalError

ACK_LOGGER = "celery.worker.request"  # the logger Celery hands ``Message.ack_log_error``
ACK_FAILED_PREFIX = "Couldn't ack"
LOST_ACK_MESSAGE = "message %s not acked: the broker connection dropped (%s); its job's recovery runs it"
CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, OperationalError, ConnectionError)


class LostAckFilter(logging.Filter):
    """Rewrite kombu's failed-ack record, when a connection error caused it, as an outage WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not (isinstance(record.msg, str) and record.msg.startswith(ACK_FAILED_PREFIX)
                and isinstance(exc, CONNECTION_ERRORS)):
            return True
        tag = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        record.msg, record.args = LOST_ACK_MESSAGE, (tag, type(exc).__name__)
        record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        record.exc_info, record.exc_text = None, None
        return True


def install(app: Any = None) -> None:
    """Attach the filter to Celery's request logger (idempotent): every record passes through it."""
    logger = logging.getLogger(ACK_LOGGER)
    if not any(isinstance(f, LostAckFilter) for f in logger.filters):
        logger.addFilter(LostAckFilter())
