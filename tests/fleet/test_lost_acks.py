"""An ack lost with the broker connection (Redis gone as a task starts) is one WARNING line, no traceback.

Real kombu on a real redis-server: a message is consumed, Redis is killed, and
the ack goes through kombu's own ``Message.ack_log_error`` with Celery's request
logger, exactly as Celery's consumer calls it when a task starts.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from kombu import Connection

import tasks  # noqa: F401  (installs the filter, as in every fleet process)
from devstack.infra import services
from tasks.hardening.lost_acks import ACK_LOGGER, LostAckFilter

QUEUE = "lost-ack-test"
GET_TIMEOUT_S = 10.0


def test_an_ack_lost_with_redis_is_an_outage_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    svc = services.start_redis(tmp_path)
    try:
        with Connection(svc.url, transport_options={"max_retries": 0}) as conn:
            queue = conn.SimpleQueue(QUEUE)
            queue.put({"job": 1})
            message = queue.get(timeout=GET_TIMEOUT_S)
            services.kill(svc)
            with caplog.at_level(logging.WARNING, logger=ACK_LOGGER):
                message.ack_log_error(logging.getLogger(ACK_LOGGER), conn.connection_errors)
    finally:
        svc.stop()
    records = [r for r in caplog.records if r.name == ACK_LOGGER]
    assert len(records) == 1, [r.getMessage() for r in records]
    record = records[0]
    assert record.levelno == logging.WARNING and record.exc_info is None and not record.exc_text
    assert "not acked: the broker connection dropped" in record.getMessage()
    assert "Traceback" not in caplog.text


def test_any_other_ack_failure_stays_critical_with_its_traceback() -> None:
    try:
        raise ValueError("not a connection error")
    except ValueError as exc:
        record = logging.LogRecord(ACK_LOGGER, logging.CRITICAL, __file__, 0, "Couldn't ack %r, reason:%r",
                                   ("tag", exc), (type(exc), exc, exc.__traceback__))
    assert LostAckFilter().filter(record)
    assert record.levelno == logging.CRITICAL and record.exc_info is not None
