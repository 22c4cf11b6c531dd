"""The verbs of ``switchyard``: one module per top-level command."""

from __future__ import annotations

import argparse
from typing import Protocol

from ops.commands import check, doctor, health, strava


class Command(Protocol):
    """What ``ops.cli`` needs from a command module."""

    def register(self, verbs: argparse._SubParsersAction) -> None: ...


COMMANDS: tuple[Command, ...] = (doctor, health, check, strava)
