"""A gate in front of one endpoint of a fake external API: a slow provider or server, on demand.

Shutdown and redelivery tests need a request to be *in flight* for as long as
they like ("mid-transcription", "mid-fetch"). Timing guesses flake; a gate makes
that a state to wait for: ``arm()``, wait for ``arrived``, act, ``open()``.
``drop()`` instead of ``open()`` answers the held request 503 without passing it
on: the call never reaches the API, as when the caller was killed mid-call and
its request died on the wire. It is ASGI middleware, so it fits any of the dev stack's starlette fakes.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable
from typing import Any

GATE_MAX_HOLD_S = 60.0  # a held request goes through after this even if no test opens the gate
DROPPED_STATUS = 503  # what a dropped request is answered (its caller is usually gone anyway)


class Gate:
    """Holds requests whose path ``matches`` until ``open()``.

    ``once``: only the first matching request after ``arm()`` is held (a
    replacement worker must get through); otherwise every matching request is
    held while the gate is armed.
    """

    def __init__(self, matches: Callable[[str], object], *, once: bool = False,
                 max_hold_s: float = GATE_MAX_HOLD_S) -> None:
        self.matches, self.once, self.max_hold_s = matches, once, max_hold_s
        self.armed = False
        self.dropped = False
        self.arrived = threading.Event()
        self.release = threading.Event()

    @classmethod
    def path_suffix(cls, suffix: str, *, once: bool = False) -> Gate:
        """A gate for the paths that end with ``suffix``."""
        return cls(lambda path: path.endswith(suffix), once=once)

    @classmethod
    def path_pattern(cls, pattern: str, *, once: bool = False) -> Gate:
        """A gate for the paths ``pattern`` (a regular expression) is found in."""
        return cls(re.compile(pattern).search, once=once)

    def arm(self) -> None:
        self.arrived.clear()
        self.release.clear()
        self.dropped = False
        self.armed = True

    def open(self) -> None:
        self.armed = False
        self.release.set()

    def drop(self) -> None:
        """Release the held request *without* passing it on: the API never sees it."""
        self.dropped = True
        self.open()

    def wrap(self, app: Any) -> GateMiddleware:
        """``app`` behind this gate (for apps built by a function rather than ``add_middleware``)."""
        return GateMiddleware(app, self)


class GateMiddleware:
    """ASGI middleware that holds the requests its ``gate`` matches (``app.add_middleware(GateMiddleware, gate=g)``)."""

    def __init__(self, app: Any, gate: Gate) -> None:
        self.app, self.gate = app, gate

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        gate = self.gate
        if scope["type"] == "http" and gate.armed and gate.matches(scope["path"]):
            if gate.once:
                gate.armed = False
            gate.arrived.set()
            await asyncio.to_thread(gate.release.wait, gate.max_hold_s)
            if gate.dropped:
                await send({"type": "http.response.start", "status": DROPPED_STATUS, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
        await self.app(scope, receive, send)
