"""Queues and routing: one queue per kind of capacity.

``io`` (downloads, short beat duties), ``gpu`` (transcription) and ``provider``
(Cairn provider work) are consumed by separate worker pools so a slow GPU
never delays a NATS ack deadline. Routing is declared here, not as task
attributes (deprecated in Celery 5.7, ecosystem §1.1).
"""

from __future__ import annotations

from kombu import Queue

QUEUE_IO = "io"
QUEUE_GPU = "gpu"
QUEUE_PROVIDER = "provider"
QUEUES = (QUEUE_IO, QUEUE_GPU, QUEUE_PROVIDER)

TASK_QUEUES = tuple(Queue(name) for name in QUEUES)

# A tuple holding one ordered list of (glob, route) pairs: the first match wins.
TASK_ROUTES = ([
    ("voicy.transcribe", {"queue": QUEUE_GPU}),
    ("voicy.*", {"queue": QUEUE_IO}),
    ("cairn.*", {"queue": QUEUE_PROVIDER}),
],)
