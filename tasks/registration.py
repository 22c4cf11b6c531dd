"""Every Celery worker registers itself while it runs: its node, queues, Cairn pool and instance (H1)."""

from __future__ import annotations

from typing import Any

from celery.signals import worker_ready, worker_shutdown, worker_shutting_down

from tasks import presence
from tasks.hardening.startup_stop import stopping
from workers import liveness
from workers.redisconn import sync_client

_renewer: liveness.Renewer | None = None
_client: Any = None
_node: str | None = None


def consumed_queues(consumer_app: Any) -> list[str]:
    """The queues this worker consumes (``-Q``), or every declared queue when it names none."""
    consume_from = consumer_app.amqp.queues.consume_from
    return sorted(consume_from or consumer_app.amqp.queues)


@worker_ready.connect
def _register(sender: Any = None, **_: object) -> None:
    """Renew this worker's record from a daemon thread of its main process (``workers.liveness``).

    ``switchyard health`` reads it to tell whether each pool has a worker and whether a provider
    worker's presence and manifest were written lately (its NATS permissions let it write both
    buckets but not read them back). A record answers at once; ``celery inspect`` waits out its
    timeout for workers that may never reply. A SIGKILLed worker's record expires.
    """
    global _renewer, _client, _node
    if _renewer is not None or sender is None or stopping():
        return  # stopping already (a stop while it started): its worker_shutting_down has come and gone
    node, queues = str(sender.hostname), consumed_queues(sender.app)
    client = sync_client(socket_timeout=liveness.REDIS_TIMEOUT_S,
                         socket_connect_timeout=liveness.REDIS_TIMEOUT_S)

    def write() -> None:
        written, pool = presence.last_presence(), presence.current_pool()
        liveness.renew(client, liveness.ProcessRecord(
            role=liveness.WORKER, name=node, queues=queues, pool=pool[0] if pool else None,
            provider=pool[1] if pool else None,
            cairn_instance=presence.current_instance_id(), presence_at=written[0] if written else None,
            presence_webhooks=written[1] if written else None, manifest_at=presence.last_manifest()))

    _client, _node, _renewer = client, node, liveness.Renewer(write).start()


@worker_shutting_down.connect
@worker_shutdown.connect
def _unregister(**_: object) -> None:
    """Stop renewing, then delete the record (the renewer first, or it could write it back).

    On ``worker_shutting_down``, sent on warm and cold stops alike: ``REMAP_SIGTERM=SIGQUIT``
    makes every stop cold, and a cold stop never sends ``worker_shutdown``.
    """
    global _renewer, _client, _node
    if _renewer is None:
        return
    _renewer.stop()
    try:
        liveness.forget(_client, liveness.WORKER, str(_node))
    except Exception:  # noqa: BLE001 - Redis away at shutdown: the record expires by itself
        pass
    _client.close()
    _renewer, _client, _node = None, None, None
