"""A once-per-outage line names its cause: the exception's message, and a traceback once (issue 14).

Before, ``Outage`` and the presence timer printed only the exception's type:
the operator saw ``presence write failed (AttributeError)`` from start to stop,
with no message and no traceback to find the bug by.
"""

from __future__ import annotations

import logging

import pytest
import redis

from workers.cairn.presence import PresenceTimer
from workers.logs import register_secret
from workers.outage import Outage

LOGGER = "test.outage.cause"


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name in (LOGGER, "workers.cairn.presence")]


def test_the_warning_carries_the_message_and_each_outage_one_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    outage = Outage("Redis", logging.getLogger(LOGGER))
    refused = "Error 111 connecting to 127.0.0.1:6390. Connection refused."
    for _ in range(3):
        outage.failed("lease read", redis.ConnectionError(refused))
    outage.ok()
    outage.failed("lease read", redis.ConnectionError(refused))

    warnings = [r for r in _records(caplog) if r.levelno == logging.WARNING and "unavailable" in r.getMessage()]
    assert len(warnings) == 2  # one per outage
    assert all("ConnectionError: Error 111 connecting to 127.0.0.1:6390" in r.getMessage() for r in warnings)
    tracebacks = [r for r in _records(caplog) if r.exc_info]
    assert len(tracebacks) == 2  # one per outage, never one per failure
    assert all(r.levelno == logging.DEBUG for r in tracebacks)  # the warning itself stays one line
    assert all("still unavailable" not in r.getMessage() or "Error 111" in r.getMessage()
               for r in _records(caplog))


def test_the_loop_wording_carries_the_message_too(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    outage = Outage.redis_loop("the poll loop", logging.getLogger(LOGGER))
    outage.failed("poll", redis.TimeoutError("Timeout reading from socket"))
    (warning,) = [r for r in _records(caplog) if r.levelno == logging.WARNING]
    assert "Redis unavailable at REDIS_URL (TimeoutError: Timeout reading from socket)" in warning.getMessage()


def test_a_secret_in_the_message_is_redacted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "hunter2-outage-secret"
    register_secret(secret)
    Outage("NATS", logging.getLogger(LOGGER)).failed("connect", OSError(f"refused for {secret}"))
    text = "\n".join(r.getMessage() for r in _records(caplog))
    assert "OSError: refused for" in text and secret not in text


def test_a_failing_presence_write_says_why_once_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """The observed line: an AttributeError of our own, not an outage: its message and traceback show."""
    caplog.set_level(logging.DEBUG)

    def write() -> object:
        raise AttributeError("'PresenceContext' object has no attribute 'worker_name'")

    timer = PresenceTimer(write, interval_s=20.0)
    assert timer.beat() is False and timer.beat() is False
    warnings = [r for r in _records(caplog) if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert ("presence write failed (AttributeError: 'PresenceContext' object has no attribute 'worker_name')"
            in warnings[0].getMessage())
    assert warnings[0].exc_info is not None  # a bug, not NATS away: its traceback, once


def test_presence_while_nats_is_away_logs_its_traceback_only_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    def write() -> object:
        raise TimeoutError("nats: timeout")

    timer = PresenceTimer(write, interval_s=20.0)
    timer.beat()
    timer.beat()
    (warning,) = [r for r in _records(caplog) if r.levelno >= logging.WARNING]
    assert "presence write failed (TimeoutError: nats: timeout)" in warning.getMessage()
    assert warning.exc_info is None
    assert len([r for r in _records(caplog) if r.exc_info and r.levelno == logging.DEBUG]) == 1
