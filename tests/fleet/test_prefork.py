"""The worker's heap is frozen once before the pool forks (``tasks/hardening/prefork.py``).

Celery collects garbage before it forks each pool child; with the imported code frozen, that
collection and the children's own walk only what is new. A real worker at DEBUG logs the
freeze once for its two children.
"""

from __future__ import annotations

import gc
import os
import re
from collections.abc import Callable, Iterator

import pytest
from celery.signals import worker_before_create_process

import tasks  # noqa: F401 - connects the handler, as in every Celery process
from tasks.hardening import prefork
from tests.kit.celery_worker import CeleryWorker


@pytest.fixture()
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    prefork._frozen[0] = False
    yield
    gc.unfreeze()  # the pytest process goes on collecting as before
    prefork._frozen[0] = False


def test_the_first_fork_freezes_the_heap_and_later_forks_leave_new_objects_collectable(unfrozen: None) -> None:
    assert gc.get_freeze_count() == 0
    worker_before_create_process.send(sender=None)  # what AsynPool sends before its gc.collect() and fork
    frozen = gc.get_freeze_count()
    assert frozen > 10_000  # the imported code
    later = [[n] for n in range(5_000)]  # tracked objects made after the first fork
    worker_before_create_process.send(sender=None)  # a replacement child later: nothing more is frozen
    assert gc.get_freeze_count() <= frozen  # (frozen objects may be freed by refcount meanwhile)
    assert len(later) == 5_000


@pytest.mark.slow
def test_a_real_worker_freezes_once_before_its_children_fork(fresh_redis: str,
                                                             celery_workers: Callable[..., CeleryWorker]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOICY_", "CAIRN_", "LOG_"))}
    env.update({"REDIS_URL": fresh_redis, "PYTHONPATH": "."})
    worker = celery_workers("io", env, concurrency=2, loglevel="DEBUG")
    worker.stop()
    frozen = re.findall(r"froze (\d+) objects before forking the pool", worker.log())
    assert len(frozen) == 1 and int(frozen[0]) > 10_000, worker.log()[-3000:]
