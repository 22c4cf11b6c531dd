"""Queues and routing: one queue per kind of capacity, and one per provider pool (C6)."""

from __future__ import annotations

from typing import Any

from kombu import Queue

# Separate worker pools consume io (downloads, short beat duties) and gpu (transcription), so a slow
# GPU never delays a NATS ack deadline. Routing is declared here, not as task attributes (ecosystem §1.1).
QUEUE_IO = "io"
QUEUE_GPU = "gpu"
QUEUES = (QUEUE_IO, QUEUE_GPU)  # the fixed queues; provider pools' queues are created as they are used
PROVIDER_QUEUE_PREFIX = "provider."
# A queue shared by every pool: a worker started with ``-Q provider`` stops at start with the line that
# says what to run instead (``tasks.presence``).
LEGACY_PROVIDER_QUEUE = "provider"
CAIRN_TASKS = "cairn."  # the prefix of every Cairn task name

TASK_QUEUES = tuple(Queue(name) for name in QUEUES)


class UnroutedPoolTask(ValueError):
    """A ``cairn.*`` task was sent without its pool's queue (a bug in the sender)."""


def provider_queue(worker_name: str) -> str:
    """The Celery queue of the provider pool ``worker_name`` (``CAIRN_WORKER_NAME``), invariant C6.

    Pools share one Redis, one NATS and their task names, so a shared queue would let one pool's worker run
    another's job with the wrong provider, limits and credentials. The pool's name, not the provider's:
    two pools may serve one provider (two Strava apps) and must still not mix."""
    return f"{PROVIDER_QUEUE_PREFIX}{worker_name}"


def pool_of_queue(queue: str) -> str | None:
    """The pool a queue belongs to (``provider.<pool>`` → ``<pool>``), None for any other queue."""
    if not queue.startswith(PROVIDER_QUEUE_PREFIX):
        return None
    return queue[len(PROVIDER_QUEUE_PREFIX):] or None


def route_cairn(name: str, args: Any, kwargs: Any, options: dict[str, Any], task: Any = None,
                **_: Any) -> dict[str, Any] | None:
    """A Cairn task keeps the queue its sender named (``tasks.cairn.PoolSenders``); one without a queue is
    refused, since it would land on the default ``io`` queue where no worker runs it."""
    if not str(name).startswith(CAIRN_TASKS) or options.get("queue"):
        return None
    raise UnroutedPoolTask(f"{name} sent without a queue: a Cairn task goes to its pool's "
                           f"{PROVIDER_QUEUE_PREFIX}<worker_name> queue")


# Routers in order, the first that answers wins: Voicy's by name glob (first match), then the
# Cairn guard, which answers nothing for a task that names its pool's queue.
TASK_ROUTES = ([
    ("voicy.transcribe", {"queue": QUEUE_GPU}),
    ("voicy.*", {"queue": QUEUE_IO}),
], route_cairn)
