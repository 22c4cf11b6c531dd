"""``python -m devstack.fakes.cairn_core --nats URL --s3 URL``: run the dev core standalone.

For the demo: optionally connects one account (``--account-*``) and runs the
reconcile scheduler; prints what it ingests until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time

from devstack.fakes.cairn_core.bootstrap import DEFAULT_RELEASE
from devstack.fakes.cairn_core.core import DEFAULT_BUCKET, DevCairnCore
from devstack.fakes.cairn_core.scheduler import SCHEDULER_TICK_S

ACCESS_TOKEN_TTL_S = 6 * 3600


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.fakes.cairn_core", description=__doc__)
    parser.add_argument("--nats", required=True, help="NATS URL, e.g. nats://127.0.0.1:4222")
    parser.add_argument("--s3", required=True, help="S3 endpoint, e.g. http://127.0.0.1:5000")
    parser.add_argument("--bucket", default=DEFAULT_BUCKET)
    parser.add_argument("--release", default=DEFAULT_RELEASE, help="cairn_core/info release")
    parser.add_argument("--provider", default="strava")
    parser.add_argument("--worker-name", help="pool of the demo account")
    parser.add_argument("--account-id")
    parser.add_argument("--external-id", help="provider account id (Strava athlete id)")
    parser.add_argument("--access-token")
    parser.add_argument("--refresh-token")
    parser.add_argument("--client-id", default="")
    parser.add_argument("--client-secret", default="")
    parser.add_argument("--scheduler-interval", type=float, default=SCHEDULER_TICK_S, metavar="SECONDS")
    parser.add_argument("--no-scheduler", action="store_true")
    parser.add_argument("--webhooks-port", type=int, default=None, metavar="PORT",
                        help="serve POST/GET /webhooks/<worker_key> on 127.0.0.1:PORT (0: a free port)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    core = DevCairnCore(args.nats, args.s3, bucket=args.bucket, release=args.release).start()
    if args.access_token:
        acct = core.connect_account(args.provider, args.account_id, args.access_token, args.refresh_token,
                                    time.time() + ACCESS_TOKEN_TTL_S, worker_name=args.worker_name,
                                    external_id=args.external_id, client_id=args.client_id,
                                    client_secret=args.client_secret)
        print(f"account {acct.account_id} user {acct.user_id} pool {acct.worker_name}", flush=True)
    if not args.no_scheduler:
        core.start_scheduler(args.scheduler_interval)
    if args.webhooks_port is not None:
        print(f"webhooks on {core.start_webhooks_http(args.webhooks_port).base_url}/webhooks/<worker_key>", flush=True)
    print(f"dev cairn core up (release {args.release}) on {args.nats}, S3 {args.s3}", flush=True)

    seen = printed_ok = printed_bad = 0
    try:
        while not stop.is_set():
            try:
                core.wait_for_results(seen + 1, timeout_s=1.0)
            except TimeoutError:
                continue
            ingested, rejected = core.ingested, core.rejected
            for r in ingested[printed_ok:]:
                print(f"result {r.subject}: ingested ({r.kind})", flush=True)
            for j in rejected[printed_bad:]:
                print(f"result {j.subject}: rejected ({j.reason})", flush=True)
            printed_ok, printed_bad = len(ingested), len(rejected)
            seen = printed_ok + printed_bad
    finally:
        core.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
