"""The worker's heap is frozen once, before the prefork pool forks its first child."""

from __future__ import annotations

import gc
import logging
from typing import Any

from celery.signals import worker_before_create_process

log = logging.getLogger(__name__)

_frozen = [False]


def freeze_heap_before_first_fork(**_: Any) -> None:
    """Freeze the main process's heap before the first pool child is forked (once per process).

    Celery runs a full ``gc.collect()`` before each fork (Celery issue #2927), walking every
    imported module's objects, which are never garbage. ``gc.freeze()`` moves them to the
    permanent generation, so that collection and the children's own skip them and stop writing
    to the inherited pages (copy-on-write keeps them shared, as the ``gc`` docs advise). Later
    forks freeze nothing more, so the main process's own garbage stays collectable.
    """
    if _frozen[0]:
        return
    _frozen[0] = True
    gc.freeze()
    log.debug("froze %d objects before forking the pool", gc.get_freeze_count())


def install(app: Any) -> None:
    """Freeze the heap before ``app``'s workers fork their pool (a strong reference: it must stay connected)."""
    worker_before_create_process.connect(freeze_heap_before_first_fork, weak=False)
