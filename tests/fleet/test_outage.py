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
from workers.outage import BLIP_S, SAME_OUTAGE_S, Outage

LOGGER = "test.outage.cause"


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name in (LOGGER, "workers.cairn.presence")]


def test_the_warning_carries_the_message_and_each_outage_one_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    clock = FakeClock()
    outage = Outage("Redis", logging.getLogger(LOGGER), clock=clock)
    refused = "Error 111 connecting to 127.0.0.1:6390. Connection refused."
    for _ in range(3):
        outage.failed("lease read", redis.ConnectionError(refused))
    outage.ok()
    clock.now += SAME_OUTAGE_S + 1  # a new outage, not the tail of the last one
    outage.failed("lease read", redis.ConnectionError(refused))

    warnings = [r for r in _records(caplog) if r.levelno == logging.WARNING and "unavailable" in r.getMessage()]
    assert len(warnings) == 2  # one per outage
    assert all("ConnectionError: Error 111 connecting to 127.0.0.1:6390" in r.getMessage() for r in warnings)
    tracebacks = [r for r in _records(caplog) if r.exc_info]
    assert len(tracebacks) == 2  # one per outage, never one per failure
    assert all(r.levelno == logging.DEBUG for r in tracebacks)  # the warning itself stays one line
    assert all("still unavailable" not in r.getMessage() or "Error 111" in r.getMessage()
               for r in _records(caplog))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_failure_just_after_the_recovery_is_a_blip_unless_it_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    """After a restart each pooled connection from before it fails once on first use: blips, at
    DEBUG. A new outage that starts just after a recovery is still reported, once failures have
    gone on for BLIP_S, naming its first failure; later than SAME_OUTAGE_S, at once."""
    caplog.set_level(logging.DEBUG)
    clock = FakeClock()
    outage = Outage("Redis", logging.getLogger(LOGGER), clock=clock)

    def loud() -> list[str]:
        return [r.getMessage() for r in _records(caplog) if r.levelno >= logging.WARNING]

    outage.failed("result pub/sub", redis.ConnectionError("Error 111 connecting"))
    clock.now += 4.0
    outage.ok()
    for _ in range(2):  # two stale connections, each found closed on first use and replaced
        clock.now += 0.5
        outage.failed("message history read", redis.ConnectionError("Connection closed by server."))
        assert outage.down  # a waiter still counts it (Outage.recently)
        clock.now += 0.01
        outage.ok()
    assert loud() == ["Redis unavailable (result pub/sub: ConnectionError: Error 111 connecting); "
                      "retrying with backoff until it is back", "Redis available again after 4.0s"]
    assert outage.outages == 1
    # a real outage 2 s after the last blip: the first failure waits, the one BLIP_S later reports it
    clock.now += 2.0
    outage.failed("lease read", redis.ConnectionError("Error 111 first"))
    assert len(loud()) == 2
    clock.now += BLIP_S
    outage.failed("liveness record", redis.ConnectionError("Error 111 later"))
    assert loud()[2] == "Redis unavailable (lease read: ConnectionError: Error 111 first); " \
                        "retrying with backoff until it is back"
    outage.failed("lease read", redis.ConnectionError("Error 111 again"))
    clock.now += 3.0
    outage.ok()
    assert loud()[3:] == ["Redis available again after 4.0s"] and outage.outages == 2
    # long after the recovery a failure is reported at once
    clock.now += SAME_OUTAGE_S
    outage.failed("lease read", redis.ConnectionError("Error 111"))
    assert len(loud()) == 5 and outage.outages == 3


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
