"""The ``switchyard`` console script: operator verbs, one module each under ``ops.commands``.

The entry point only builds the parser from ``ops.commands.COMMANDS`` and runs
the chosen verb, so adding a verb (``switchyard strava webhook ...``) is one
new module plus one line in that tuple, and never an edit here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from ops.commands import COMMANDS, Command

DESCRIPTION = "Operator tools for a Switchyard deployment."
EPILOG = "Run 'switchyard COMMAND --help' for the options of one command."


def build_parser(commands: Iterable[Command] = COMMANDS) -> argparse.ArgumentParser:
    """The whole command tree: each command module adds its own sub-parser (and sub-verbs)."""
    parser = argparse.ArgumentParser(prog="switchyard", description=DESCRIPTION, epilog=EPILOG)
    verbs = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands:
        command.register(verbs)
    return parser


def main(argv: list[str] | None = None, commands: Iterable[Command] = COMMANDS) -> int:
    """Parse ``argv`` and run the chosen verb; its return value is the exit code."""
    args = build_parser(commands).parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
