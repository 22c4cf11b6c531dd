"""The Celery application: ``celery -A tasks worker -Q gpu`` finds ``tasks.app``."""

from __future__ import annotations

import sys

import click
from celery import Celery
from celery.signals import after_setup_logger, after_setup_task_logger

import workers  # noqa: F401  (before any pydantic model: it switches off a start-up cost, see workers/__init__.py)
from tasks import hardening
from tasks.settings import celery_config
from workers.errors import ConfigError
from workers.logs import adopt_handlers

EXIT_CONFIG_ERROR = 2  # as ``python -m bridges`` and the Voicy worker's start check
CELERY_COMMAND = "celery"  # the click group of Celery's command line

# Task modules are thin: parse input, call ``workers/``, map the outcome. Importing this package reads
# the fleet's settings; a bad value is a ConfigError naming the variable (_stop_celery_command).
app = Celery("switchyard")


def _stop_celery_command(exc: ConfigError) -> None:
    """Under ``celery -A tasks ...``, end the command with one line naming the variable, exit 2.

    Celery's command line imports the app inside its click callback and turns
    any ``Exception`` raised there into "Unable to load celery application"
    and a 40-line traceback. ``SystemExit`` is no ``Exception``: it passes
    through click with our line and exit code, as the bridges print theirs.
    Any other importer (a bridge, the doctor, a test) gets the ``ConfigError``
    itself and reports it its own way.
    """
    ctx = click.get_current_context(silent=True)
    if ctx is None or ctx.find_root().command.name != CELERY_COMMAND:
        return
    verb = ctx.invoked_subcommand or CELERY_COMMAND
    print(f"switchyard celery {verb}: {exc}", file=sys.stderr)
    raise SystemExit(EXIT_CONFIG_ERROR) from None


@after_setup_logger.connect
@after_setup_task_logger.connect
def _redact_celery_logs(logger: object, **_: object) -> None:
    """Celery's own handlers (worker, beat, task loggers) redact too, and honour ``LOG_FORMAT``."""
    adopt_handlers(logger)  # type: ignore[arg-type]


try:
    app.conf.update(celery_config())
    hardening.install(app)
    # Importing registers the tasks and signal handlers with ``app``; beat reads its periods.
    from tasks import beat as _beat  # noqa: E402,F401
    from tasks import cairn as _cairn  # noqa: E402,F401
    from tasks import presence as _presence  # noqa: E402,F401
    from tasks import registration as _registration  # noqa: E402,F401  (after presence: its instance id)
    from tasks import voicy as _voicy  # noqa: E402,F401
except ConfigError as exc:
    _stop_celery_command(exc)
    raise

__all__ = ["app"]
