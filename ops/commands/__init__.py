"""The verbs of ``switchyard``: one module per top-level command.

A command module provides ``register(verbs)``, which adds its parser to the
``argparse`` sub-parsers ``verbs`` and sets ``run`` on it with
``parser.set_defaults(run=...)``. ``run(args)`` returns the exit code. A verb
with sub-verbs (``check cairn``, ``strava webhook subscribe``) adds its own
sub-parsers inside ``register`` and sets ``run`` on each leaf.

To add a verb: write ``ops/commands/<verb>.py`` with ``register`` and append
the module to ``COMMANDS`` (the order is the order of ``switchyard --help``).
"""

from __future__ import annotations

import argparse
from typing import Protocol

from ops.commands import check, doctor, health, strava


class Command(Protocol):
    """What ``ops.cli`` needs from a command module."""

    def register(self, verbs: argparse._SubParsersAction) -> None: ...  # type: ignore[type-arg]


COMMANDS: tuple[Command, ...] = (doctor, health, check, strava)  # type: ignore[assignment]
