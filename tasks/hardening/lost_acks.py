"""An ack lost with the broker connection is an outage line, not a CRITICAL with a traceback."""

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
    """Rewrite kombu's failed-ack record, when a connection error caused it, as an outage WARNING.

    Under early ack, Redis going away as a task starts loses the ack; nothing is lost and no
    operator is needed: the task runs, and the unacked message is run by its job's recovery or,
    restored later, finds its lease changed and does nothing. Any other ack failure keeps
    Celery's CRITICAL and traceback, because that one is news (R1, H1).
    """

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
