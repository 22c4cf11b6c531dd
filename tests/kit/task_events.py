"""What Flower sees: a capture of the fleet's Celery task events, for the secret and quiet-beat checks."""

from __future__ import annotations

import json
import threading
from typing import Any

SUBSCRIBE_TIMEOUT_S = 30.0
JOIN_TIMEOUT_S = 10.0


class TaskEvents:
    """What Flower sees: the task events (``task-sent`` carries args, ``task-succeeded`` the result)."""

    def __init__(self, redis_url: str) -> None:
        from celery import Celery

        self.app = Celery("flower-probe", broker=redis_url)
        self.events: list[dict[str, Any]] = []
        self.subscribed = threading.Event()
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _on(self, event: dict[str, Any]) -> None:
        if event.get("type") == "worker-heartbeat":
            self.subscribed.set()
        self.events.append(event)

    def _run(self) -> None:
        with self.app.connection() as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self._on})
            self._receiver.capture(limit=None, timeout=None, wakeup=True)

    def __enter__(self) -> TaskEvents:
        self._thread.start()
        assert self.subscribed.wait(SUBSCRIBE_TIMEOUT_S), "no worker heartbeat: event capture not subscribed"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(JOIN_TIMEOUT_S)

    def text(self) -> str:
        return "\n".join(json.dumps(e, default=str) for e in self.events)
