"""``switchyard check <target>``: conformance checks against a live deployment.

``check cairn`` is our port of cairn-core's ``cmd/worker-conformance``
(contract §10, reference §5) to the 0.7 pool-scoped subjects; see
:mod:`ops.cairn_check`. A new target is one more sub-parser here.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from ops import cairn_check_webhooks
from ops.cairn_check import DEFAULT_CHECK_TIMEOUT_S, CheckOptions, run_checks

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
HELP = "conformance checks against a live pool"
CAIRN_DESCRIPTION = """\
The Cairn provider contract 0.7 §10 checks against a live pool: presence,
a durable consumer for every job kind the pool must serve, discover
request/reply, and with --active a reconcile round trip through core.

Exit code: 0 compliant, 1 violations, 2 usage or connection error."""


def register(verbs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    check = verbs.add_parser("check", help=HELP, description=HELP)
    targets = check.add_subparsers(dest="target", required=True, metavar="TARGET")
    cairn = targets.add_parser("cairn", help="Cairn provider contract 0.7 §10 checks",
                               description=CAIRN_DESCRIPTION,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    cairn.add_argument("--nats", default=DEFAULT_NATS_URL,
                       help="NATS URL of the dev/staging stack (default %(default)s)")
    cairn.add_argument("--provider", required=True, help="provider type, e.g. strava")
    cairn.add_argument("--worker-name", default=None, help="pool name (default <provider>-fetcher)")
    cairn.add_argument("--active", action="store_true", help="also round-trip a synthetic reconcile job")
    cairn.add_argument("--account-id", default="", help="connected account for --active")
    cairn.add_argument("--user-id", default="", help="owner of --account-id; optional as in the Go harness "
                       "(without it the pool answers the reconcile without listing)")
    cairn.add_argument("--metrics", action="store_true", help="require an import_metrics consumer")
    cairn.add_argument("--gear", action="store_true", help="require an import_gear consumer")
    cairn.add_argument("--no-parse-blob", dest="parse_blob", action="store_false",
                       help="do not require a parse_blob consumer (pool archives no raw blobs)")
    cairn.add_argument("--timeout", type=float, default=DEFAULT_CHECK_TIMEOUT_S, metavar="SECONDS",
                       help="seconds per check (default %(default)s)")
    cairn_check_webhooks.add_arguments(cairn)  # --webhooks, --verify-token
    cairn.set_defaults(run=run_cairn)


def run_cairn(args: argparse.Namespace) -> int:
    options = CheckOptions(nats_url=args.nats, provider=args.provider,
                           worker_name=args.worker_name or f"{args.provider}-fetcher",
                           active=args.active, account_id=args.account_id, user_id=args.user_id,
                           metrics=args.metrics, gear=args.gear, parse_blob=args.parse_blob,
                           timeout_s=args.timeout, webhooks=args.webhooks, verify_token=args.verify_token)
    return asyncio.run(run_checks(options, out=sys.stdout))
