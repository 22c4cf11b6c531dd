"""ASGI middleware that makes a fake external API slow: every matching request waits first.

A fast in-memory fake finishes a job before a kill can land in it; the real
Strava answers in a few hundred milliseconds. The chaos harness puts this in
front of the fake Strava so a job spends its time where a real one does: in
flight, holding its message, its lease and its slot.
"""

from __future__ import annotations

import asyncio
from typing import Any


class LatencyMiddleware:
    """Hold each HTTP request whose path starts with ``prefix`` for ``delay_s`` before serving it."""

    def __init__(self, app: Any, *, delay_s: float, prefix: str = "/") -> None:
        self.app, self.delay_s, self.prefix = app, delay_s, prefix

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self.prefix):
            await asyncio.sleep(self.delay_s)
        await self.app(scope, receive, send)
