"""Queues and routing: one queue per kind of capacity, and one per provider pool.

``io`` (downloads, short beat duties) and ``gpu`` (transcription) are consumed
by separate worker pools so a slow GPU never delays a NATS ack deadline.
Routing is declared here, not as task attributes (deprecated in Celery 5.7,
ecosystem §1.1).

**Provider pools (invariant C6).** Every Cairn task goes to the queue of the pool
that sent it, ``provider.<worker_name>`` (:func:`provider_queue`), and each pool's
workers consume only their own (``celery -A tasks worker -Q provider.strava-fetcher``).
Several pools share one Redis and one NATS, and their task names are the same
(``cairn.job`` …); a shared queue would let the Strava worker take a Garmin job
and run it with the wrong provider, rate limits and credentials. The name is
the pool's (``CAIRN_WORKER_NAME``), not the provider's, because two pools may
serve one provider (two Strava apps) and must still not mix.

The sender names the queue: the bridge is built for one pool and sends on its
queue (``tasks.cairn.PoolSenders``). :func:`route_cairn` only guards that: a
``cairn.*`` task sent without a queue has no pool, and would land on the default
``io`` queue where nobody runs it, so sending it is an error. The former shared
``provider`` queue is gone: a worker started with ``-Q provider`` stops at start
with the line that says what to run instead (``tasks.presence``).
"""

from __future__ import annotations

from typing import Any

from kombu import Queue

QUEUE_IO = "io"
QUEUE_GPU = "gpu"
QUEUES = (QUEUE_IO, QUEUE_GPU)  # the fixed queues; provider pools' queues are created as they are used
PROVIDER_QUEUE_PREFIX = "provider."
LEGACY_PROVIDER_QUEUE = "provider"  # every pool's tasks shared it before pools got queues of their own
CAIRN_TASKS = "cairn."  # the prefix of every Cairn task name

TASK_QUEUES = tuple(Queue(name) for name in QUEUES)


class UnroutedPoolTask(ValueError):
    """A ``cairn.*`` task was sent without its pool's queue (a bug in the sender)."""


def provider_queue(worker_name: str) -> str:
    """The Celery queue of the provider pool ``worker_name`` (``CAIRN_WORKER_NAME``)."""
    return f"{PROVIDER_QUEUE_PREFIX}{worker_name}"


def pool_of_queue(queue: str) -> str | None:
    """The pool a queue belongs to (``provider.<pool>`` → ``<pool>``), None for any other queue."""
    if not queue.startswith(PROVIDER_QUEUE_PREFIX):
        return None
    return queue[len(PROVIDER_QUEUE_PREFIX):] or None


def route_cairn(name: str, args: Any, kwargs: Any, options: dict[str, Any], task: Any = None,
                **_: Any) -> dict[str, Any] | None:
    """A Cairn task keeps the queue its sender named; one without a queue is refused (see above)."""
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
