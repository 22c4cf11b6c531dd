"""Queue lengths as Prometheus gauges, read from the broker each time Flower's ``/metrics`` is scraped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import redis
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector
from redis.backoff import NoBackoff
from redis.retry import Retry

from tasks.hardening.transport import PRIORITY_STEPS, UNACKED_KEY, queue_keys
from tasks.routes import QUEUES, provider_queue
from workers import liveness
from workers.outage import Outage
from workers.redisconn import sync_client

log = logging.getLogger(__name__)

QUEUE_MESSAGES = "switchyard_queue_messages"
UNACKED_MESSAGES = "switchyard_unacked_messages"
BROKER_UP = "switchyard_broker_up"
# Flower serves ``/metrics`` on its one event loop, so a scrape while Redis is away or cut off must give
# up soon rather than stall every page: one try, each socket operation bounded by this.
SCRAPE_TIMEOUT_S = 1.0

ClientFactory = Callable[[], redis.Redis]


def _scrape_client() -> redis.Redis:
    """The fleet's Redis (``REDIS_URL``, Sentinel-aware), tried once per command within the scrape bound."""
    return sync_client(socket_timeout=SCRAPE_TIMEOUT_S, socket_connect_timeout=SCRAPE_TIMEOUT_S,
                       retry=Retry(NoBackoff(), 0))


def fleet_queues(client: redis.Redis) -> list[str]:
    """``gpu`` and ``io``, every queue a live worker consumes, and the queue of every pool a live worker or
    Cairn bridge serves (a pool whose workers are all down still has its queue, and work waits in it)."""
    queues = set(QUEUES)
    for record in liveness.read(client, liveness.WORKER):
        queues.update(record.queues)
    for record in liveness.read(client, liveness.CAIRN_BRIDGE):
        if record.pool:
            queues.add(provider_queue(record.pool))
    return sorted(queues)


def queue_lengths(client: redis.Redis, queues: Iterable[str]) -> tuple[dict[str, int], int]:
    """The messages waiting in each queue (every kombu priority step summed), and those delivered to a
    worker and not yet acked, in the whole fleet; one round trip."""
    names = list(queues)
    with client.pipeline(transaction=False) as pipe:
        for name in names:
            for key in queue_keys(name):
                pipe.llen(key)
        pipe.hlen(UNACKED_KEY)
        *lengths, unacked = pipe.execute()
    steps = len(PRIORITY_STEPS)  # queue_keys gives one key per step, in step order
    waiting = {name: sum(lengths[i * steps:(i + 1) * steps]) for i, name in enumerate(names)}
    return waiting, int(unacked)


class QueueLengths(Collector):
    """What ``/metrics`` adds to Flower's own gauges: Flower has task and worker figures, but nothing on
    the work still waiting, which is what says a pool is short of capacity (docs/operations.md 5).

    A scrape that cannot read the broker reports ``switchyard_broker_up 0`` and no lengths (a stale
    length would look like a live one); the outage is logged as every process logs one (``Outage``):
    once when it starts, once when it ends, not once per scrape.
    """

    def __init__(self, client_factory: ClientFactory = _scrape_client) -> None:
        self._client_factory = client_factory
        self._client: redis.Redis | None = None
        self._lock = threading.Lock()  # prometheus_client may collect from more than one thread
        self._outage = Outage("Redis", log)

    def describe(self) -> Iterator[Any]:
        """Nothing: otherwise registering would collect once, reading Redis as Flower starts."""
        return iter(())

    def _read(self) -> tuple[dict[str, int], int] | None:
        """The queue lengths and the unacked count, or None while Redis cannot be read."""
        with self._lock:
            try:
                if self._client is None:
                    self._client = self._client_factory()
                lengths = queue_lengths(self._client, fleet_queues(self._client))
            except redis.RedisError as exc:
                self._outage.failed("queue lengths", exc)
                return None
            self._outage.ok()
            return lengths

    def collect(self) -> Iterator[GaugeMetricFamily]:
        read = self._read()
        if read is not None:
            waiting, unacked = read
            messages = GaugeMetricFamily(QUEUE_MESSAGES, "Task messages waiting in a Celery queue", labels=["queue"])
            for name, count in waiting.items():
                messages.add_metric([name], count)
            yield messages
            yield GaugeMetricFamily(UNACKED_MESSAGES, "Task messages delivered to a worker and not yet acked",
                                    value=unacked)
        yield GaugeMetricFamily(BROKER_UP, "1 if this scrape read the queue lengths from the broker, else 0",
                                value=int(read is not None))

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


_installed: QueueLengths | None = None


def install() -> QueueLengths:
    """Register the collector with prometheus_client's default registry (the one Flower serves) once."""
    global _installed
    if _installed is None:
        _installed = QueueLengths()
        REGISTRY.register(_installed)
    return _installed
