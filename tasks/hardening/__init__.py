"""The hooks that make Celery and kombu safe for the fleet: one ``install(app)`` each, listed once."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from tasks.hardening import (
    consumer,
    lost_acks,
    masked_url,
    prefork,
    quick_drain,
    result_backend,
    scheduler,
    startup_stop,
    stop_consuming,
    stop_timers,
    thread_stop,
    transport,
)

# In the order they are installed: the configuration the first four rewrite must be in place already
# (``tasks.settings.celery_config``); the rest hook signals, bootsteps and loggers.
HARDENING: tuple[ModuleType, ...] = (transport, result_backend, consumer, scheduler, startup_stop, stop_consuming,
                                     quick_drain, stop_timers, thread_stop, lost_acks, masked_url, prefork)


def install(app: Any) -> None:
    """Install every hook of :data:`HARDENING` on ``app``, whose configuration is already loaded."""
    for hook in HARDENING:
        hook.install(app)
