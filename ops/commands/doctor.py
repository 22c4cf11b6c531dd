"""``switchyard doctor``: check this host's configuration, one line per check (see ``ops.doctor``)."""

from __future__ import annotations

import argparse
import sys

from ops import doctor

HELP = "check this deployment's configuration and services, one line per check"
DESCRIPTION = """\
Check this host's configuration against the services it names, one line per
check (ok / FAIL / skip), then a summary. A side that is not configured (no
VOICY_WORKER_API_URL, no CAIRN_NATS_URL) is skipped. Each network check gives
up after its timeout, so an unreachable service is one FAIL line.

Exit code: 0 when nothing failed, 1 otherwise."""


def register(verbs: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser("doctor", help=HELP, description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return doctor.run(sys.stdout)
