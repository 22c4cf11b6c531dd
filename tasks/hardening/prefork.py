"""The worker's heap is frozen once, before the prefork pool forks its first child.

Why: Celery runs a full ``gc.collect()`` before it forks each pool child (Celery
issue #2927, ``AsynPool._create_worker_process``). At that point the main process
holds every module the worker imported, about 90 000 objects that will never be
garbage, and each collection walks them all: 0.05-0.08 CPU-s per child, paid again
for every replacement child (a gpu dyno's one child, an io dyno's four, a provider
dyno's eight). ``gc.freeze()`` moves those objects to the permanent generation, so
Celery's collection only walks what was created since, and so do the children's
own collections, which also stop writing to the inherited pages: copy-on-write
keeps them shared between the children, as Python's ``gc`` documentation advises
for a parent that forks without exec.

The freeze happens once, in ``worker_before_create_process`` (sent right before
Celery's ``gc.collect()``): the heap is the imported code then. Objects that are
already unreachable cycles at that moment stay allocated for good; a worker's
import phase leaves about 70 of them. Later forks (replacement children) freeze
nothing more, so the main process's own garbage stays collectable.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

from celery.signals import worker_before_create_process

log = logging.getLogger(__name__)

_frozen = [False]


def freeze_heap_before_first_fork(**_: Any) -> None:
    """Freeze the main process's heap before the first pool child is forked (once per process)."""
    if _frozen[0]:
        return
    _frozen[0] = True
    gc.freeze()
    log.debug("froze %d objects before forking the pool", gc.get_freeze_count())


def install(app: Any) -> None:
    """Freeze the heap before ``app``'s workers fork their pool (a strong reference: it must stay connected)."""
    worker_before_create_process.connect(freeze_heap_before_first_fork, weak=False)
