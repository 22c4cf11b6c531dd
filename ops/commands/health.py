"""``switchyard health``: is the running fleet well? One line per part (see ``ops.health``)."""

from __future__ import annotations

import argparse
import sys

from ops import health

HELP = "check a running fleet's health, one line per part"
DESCRIPTION = """\
Check that the running fleet does its duties, from the records its processes
keep: Redis and NATS reachable, a Celery worker on each queue the configured
sides need, beat holding its lock, the Voicy bridge polling, every provider
worker's presence live for core (with the right webhooks flag), the manifest
fresh, every durable consumer the pool needs bound, no permanent fault
recorded. Run it with the fleet's own environment (REDIS_URL, VOICY_*,
CAIRN_*). The doctor checks configuration; this checks a running fleet.

Exit code: 0 healthy, 1 unhealthy (the last line names each failing part)."""


def register(verbs: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser("health", help=HELP, description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout", type=float, default=health.DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help="seconds per network call (default %(default)s)")
    parser.add_argument("--clear-faults", action="store_true",
                        help="forget the recorded permanent faults first (after fixing their cause)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return health.run(sys.stdout, args.timeout, clear=args.clear_faults)
