"""``switchyard check <target>``: conformance checks against a live deployment; a target is a sub-parser."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from pydantic import SecretStr

from ops import cairn_check_webhooks
from ops.cairn_check import DEFAULT_CHECK_TIMEOUT_S, EXIT_CONNECT, CheckOptions, run_checks
from workers.cairn.nats_conn import connect_options
from workers.cairn.settings import SECRET_CREDENTIALS, CairnSettings, load_cairn_settings
from workers.errors import ConfigError

HELP = "conformance checks against a live pool"
CAIRN_DESCRIPTION = """\
The Cairn provider contract 0.7 §10 checks against a live pool: presence,
a durable consumer for every job kind the pool must serve, discover
request/reply, and with --active a reconcile round trip through core.

It reads the pool's CAIRN_* settings (CAIRN_NATS_URL,
CAIRN_NATS_USER/CAIRN_NATS_PASSWORD, CAIRN_NATS_CREDS,
CAIRN_WORKER_ENROLLMENT_TOKEN, CAIRN_PROVIDER, CAIRN_WORKER_NAME); each option
below overrides its variable, and any credential option replaces all of them.
The checks need core's (or an admin's) NATS login, not the pool's.

Exit code: 0 compliant, 1 violations, 2 usage, connection error or a login
NATS does not allow to check."""
# Credential options -> the CairnSettings field each one sets. Any one replaces every credential
# variable, so ``--user`` is never silently outranked by an enrollment token in the environment.
CREDENTIAL_OPTIONS = {"user": "nats_user", "password": "nats_password", "creds": "nats_creds",
                      "enrollment_token": "worker_enrollment_token"}


def register(verbs: argparse._SubParsersAction) -> None:
    check = verbs.add_parser("check", help=HELP, description=HELP)
    targets = check.add_subparsers(dest="target", required=True, metavar="TARGET")
    cairn = targets.add_parser("cairn", help="Cairn provider contract 0.7 §10 checks",
                               description=CAIRN_DESCRIPTION,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    cairn.add_argument("--nats", default=None, metavar="URL",
                       help="core's NATS URL (default $CAIRN_NATS_URL, else nats://127.0.0.1:4222)")
    cairn.add_argument("--user", default=None, help="NATS user (default $CAIRN_NATS_USER)")
    cairn.add_argument("--password", default=None,
                       help="NATS password (default $CAIRN_NATS_PASSWORD, which keeps it out of the process list)")
    cairn.add_argument("--creds", default=None, metavar="FILE", help="NATS .creds file (default $CAIRN_NATS_CREDS)")
    cairn.add_argument("--enrollment-token", default=None, metavar="TOKEN",
                       help="enrollment token for core's auth callout (default $CAIRN_WORKER_ENROLLMENT_TOKEN); "
                            "connects under the pool's name, as the pool does")
    provider = os.environ.get("CAIRN_PROVIDER", "").strip() or None
    cairn.add_argument("--provider", default=provider, required=provider is None,
                       help="provider type, e.g. strava (default $CAIRN_PROVIDER)")
    cairn.add_argument("--worker-name", default=None,
                       help="pool name (default $CAIRN_WORKER_NAME, else <provider>-fetcher)")
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


def connection_settings(args: argparse.Namespace) -> CairnSettings:
    """The pool's ``CAIRN_*`` settings with this command's options on top (``ConfigError`` names a bad one).

    Connecting with the pool's own ``connect_options`` finds the pool by itself on a host of the fleet."""
    worker_name = args.worker_name or os.environ.get("CAIRN_WORKER_NAME", "").strip() or f"{args.provider}-fetcher"
    overrides: dict[str, object] = {"provider": args.provider, "worker_name": worker_name}
    if args.nats:
        overrides["nats_url"] = args.nats
    if not any(getattr(args, option) for option in CREDENTIAL_OPTIONS):
        return load_cairn_settings(**overrides)
    login = {name: getattr(args, option) for option, name in CREDENTIAL_OPTIONS.items()}
    settings = load_cairn_settings(**overrides, **login)  # validated like the variables (a password needs a user)
    # Set again: the settings apply the pool's own CAIRN_POOL_<pool>_* credentials after the constructor's.
    return settings.model_copy(update={name: SecretStr(value) if value is not None and name in SECRET_CREDENTIALS
                                       else value for name, value in login.items()})


def run_cairn(args: argparse.Namespace) -> int:
    try:
        settings = connection_settings(args)
    except ConfigError as exc:
        print(f"switchyard check cairn: {exc}", file=sys.stderr)
        return EXIT_CONNECT
    connect = connect_options(settings)
    if settings.worker_enrollment_token is None:  # only core's auth callout needs the pool's name on the connection
        connect.pop("name", None)
    options = CheckOptions(nats_url=settings.nats_url, provider=settings.provider, worker_name=settings.worker_name,
                           active=args.active, account_id=args.account_id, user_id=args.user_id,
                           metrics=args.metrics, gear=args.gear, parse_blob=args.parse_blob,
                           timeout_s=args.timeout, webhooks=args.webhooks, verify_token=args.verify_token,
                           connect=connect)
    return asyncio.run(run_checks(options, out=sys.stdout))
