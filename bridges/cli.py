"""The ``switchyard`` console script: ``switchyard check cairn`` and ``switchyard doctor``.

``check cairn`` is our port of cairn-core's ``cmd/worker-conformance``
(contract §10, reference §5) to the 0.7 pool-scoped subjects; see
:mod:`bridges.cairn_check`. Exit codes follow the Go harness: 0 compliant,
1 violations, 2 usage or connection error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from bridges import cairn_check_webhooks, strava_webhook

EXIT_OK = 0
EXIT_VIOLATIONS = 1
EXIT_USAGE = 2
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
DEFAULT_CHECK_TIMEOUT_S = 10.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="check this deployment's configuration, one line per check")
    check = sub.add_parser("check", help="conformance checks against a live pool")
    check_sub = check.add_subparsers(dest="target", required=True)
    cairn = check_sub.add_parser("cairn", help="Cairn provider contract 0.7 §10 checks")
    cairn.add_argument("--nats", default=DEFAULT_NATS_URL, help="NATS URL of the dev/staging stack")
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
    cairn.add_argument("--timeout", type=float, default=DEFAULT_CHECK_TIMEOUT_S,
                       help="seconds per check")
    cairn_check_webhooks.add_arguments(cairn)  # pluggable: --webhooks, --verify-token
    strava_webhook.add_parser(sub)  # pluggable: switchyard strava webhook subscribe|show|delete
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "doctor":
        from bridges.doctor import run as run_doctor

        return run_doctor(sys.stdout)
    if args.command == "strava":
        return strava_webhook.run(args)
    from bridges.cairn_check import CheckOptions, run_checks

    options = CheckOptions(nats_url=args.nats, provider=args.provider,
                           worker_name=args.worker_name or f"{args.provider}-fetcher",
                           active=args.active, account_id=args.account_id, user_id=args.user_id,
                           metrics=args.metrics, gear=args.gear, parse_blob=args.parse_blob,
                           timeout_s=args.timeout, webhooks=args.webhooks, verify_token=args.verify_token)
    return asyncio.run(run_checks(options, out=sys.stdout))


if __name__ == "__main__":
    sys.exit(main())
