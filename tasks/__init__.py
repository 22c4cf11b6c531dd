"""The Celery application: ``celery -A tasks worker -Q gpu`` finds ``tasks.app``.

Task modules are thin: parse input, call ``workers/``, map the outcome.
"""

from __future__ import annotations

from celery import Celery

from tasks.settings import celery_config

app = Celery("switchyard")
app.conf.update(celery_config())

# Importing registers the tasks and signal handlers with ``app``.
from tasks import voicy as _voicy  # noqa: E402,F401
from tasks import cairn as _cairn  # noqa: E402,F401
from tasks import beat as _beat  # noqa: E402,F401

__all__ = ["app"]
