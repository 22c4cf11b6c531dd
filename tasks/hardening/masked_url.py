"""Celery masks the broker URL with a throwaway kombu Connection: that Connection's TLS warning is not news."""

from __future__ import annotations

import inspect
import logging
from typing import Any

KOMBU_CONNECTION_LOGGER = "kombu.connection"
NO_TLS_OPTIONS_PREFIX = "Secure redis scheme specified (rediss) with no ssl options"
# Where Celery builds it: ``celery.app.utils.maybe_censor`` masks ``broker_url`` as ``Connection(url).as_uri()``.
CENSOR_MODULE, CENSOR_FUNCTION = "celery.app.utils", "maybe_censor"


def _censoring() -> bool:
    """Whether Celery's URL masking is on the stack of the record being logged."""
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == CENSOR_FUNCTION and frame.f_globals.get("__name__") == CENSOR_MODULE:
            return True
        frame = frame.f_back
    return False


class MaskedUrlFilter(logging.Filter):
    """Drop kombu's "rediss with no ssl options" warning when Celery's URL masking provoked it.

    Flower asks every worker for its configuration (``celery inspect conf``), and Celery masks the
    broker URL in the reply by building a kombu ``Connection`` from the bare ``rediss://`` URL: one
    that never connects and carries no ``broker_use_ssl``, so kombu warns of insecure TLS in every
    worker, once per ask. The fleet's own connections always carry the TLS options
    (``tasks.settings``); the same warning from any other caller still passes.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(NO_TLS_OPTIONS_PREFIX) and _censoring())


def install(app: Any = None) -> None:
    """Attach the filter to kombu's connection logger (idempotent)."""
    logger = logging.getLogger(KOMBU_CONNECTION_LOGGER)
    if not any(isinstance(f, MaskedUrlFilter) for f in logger.filters):
        logger.addFilter(MaskedUrlFilter())
