"""The Celery application: ``celery -A tasks worker -Q gpu`` finds ``tasks.app``.

Task modules are thin: parse input, call ``workers/``, map the outcome.
"""

from __future__ import annotations

from celery import Celery
from celery.signals import after_setup_logger, after_setup_task_logger

from tasks.settings import celery_config
from workers.logs import adopt_handlers

app = Celery("switchyard")
app.conf.update(celery_config())


@after_setup_logger.connect
@after_setup_task_logger.connect
def _redact_celery_logs(logger: object, **_: object) -> None:
    """Celery's own handlers (worker, beat, task loggers) redact too, and honour ``LOG_FORMAT``."""
    adopt_handlers(logger)  # type: ignore[arg-type]

# Importing registers the tasks and signal handlers with ``app``.
from tasks import voicy as _voicy  # noqa: E402,F401
from tasks import cairn as _cairn  # noqa: E402,F401
from tasks import presence as _presence  # noqa: E402,F401
from tasks import beat as _beat  # noqa: E402,F401

__all__ = ["app"]
