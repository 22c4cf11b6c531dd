"""Messages put on a Celery queue through kombu, as a sender puts them (the broker's own lists)."""

from __future__ import annotations

from kombu import Connection, Queue


def publish(url: str, queue: str, count: int, priority: int | None = None) -> None:
    """``count`` small messages on ``queue`` (declared as Celery declares it); with ``priority`` they wait
    in that priority step's list, not the queue's own."""
    with Connection(url) as conn, conn.Producer() as producer:
        for n in range(count):
            producer.publish({"n": n}, routing_key=queue, declare=[Queue(queue)], priority=priority)
