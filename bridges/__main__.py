"""``python -m bridges voicy|cairn``: run one bridge process until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from workers.config import load_settings
from workers.errors import ConfigError
from workers.logs import setup_logging

log = logging.getLogger("bridges")
EXIT_CONFIG_ERROR = 2
# Not an error: this deployment does not use the side. Exiting at once beats failing on a missing URL
# or dialling the default NATS, which the platform would restart into a crash loop; Heroku restarts even
# a clean exit, so app.json leaves both bridges out of the formation until a side is configured.
EXIT_NOT_CONFIGURED = 0
# Any one of these set means the side is in use (as beat, the provider pool and the doctor decide);
# a side set only in part (a token without its URL) is a misconfiguration: EXIT_CONFIG_ERROR.
SIDE_VARIABLES = {"voicy": ("VOICY_WORKER_API_URL", "VOICY_WORKER_TOKEN"), "cairn": ("CAIRN_NATS_URL",)}
SIDE_NAMES = {"voicy": "Voicy", "cairn": "Cairn"}


def side_configured(bridge: str) -> bool:
    """Whether any variable that turns ``bridge``'s side on is set (empty counts as unset)."""
    return any(os.environ.get(name, "").strip() for name in SIDE_VARIABLES[bridge])


# Each bridge imports its own side inside its runner: a Voicy bridge never loads nats-py and the
# Cairn contract code, a Cairn bridge never loads the Voicy pipeline; and a bad value read while
# ``tasks`` is imported is a ConfigError that main() turns into one line.
def _run_voicy() -> None:
    # Function-level on purpose: only the Voicy side, and inside main()'s ConfigError handler.
    from bridges.voicy import VoicyBridge
    from tasks.settings import FleetSettings
    from tasks.voicy import dispatch_download, dispatch_transcription
    from workers.voicy.runtime import VoicyRuntime

    rt = VoicyRuntime.from_env(load_settings(FleetSettings).redis_url)
    bridge = VoicyBridge(rt, dispatch_download, dispatch_transcription)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: bridge.stop())
    bridge.run()


def _run_cairn() -> None:
    # Function-level on purpose: only the Cairn side, and inside main()'s ConfigError handler.
    from bridges.cairn import webhooks
    from bridges.cairn.bridge import TaskSenders
    from bridges.cairn.bridge import main as cairn_main
    from tasks import app
    from tasks.cairn import PoolSenders
    from workers.cairn.settings import load_cairn_settings
    from workers.providers.registry import get_provider

    settings = load_cairn_settings()
    provider = get_provider(settings.provider, settings)  # one provider: the bridge's and its webhook rules
    pool = PoolSenders(settings.worker_name)  # every task on provider.<pool>: pools never share a queue (C6)
    cairn_main(settings, provider, TaskSenders(job=pool.job, discover=pool.discover, exchange=pool.exchange),
               app.backend, extra=webhooks.consumptions(settings, provider),
               replies=webhooks.replies(settings, provider))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bridges", description=__doc__)
    parser.add_argument("bridge", choices=["voicy", "cairn"])
    args = parser.parse_args(argv)
    if not side_configured(args.bridge):
        print(f"switchyard {args.bridge} bridge: the {SIDE_NAMES[args.bridge]} side is not configured "
              f"({' / '.join(SIDE_VARIABLES[args.bridge])} unset); nothing to bridge, exiting", file=sys.stderr)
        return EXIT_NOT_CONFIGURED
    setup_logging()
    try:
        {"voicy": _run_voicy, "cairn": _run_cairn}[args.bridge]()
    except ConfigError as exc:
        print(f"switchyard {args.bridge} bridge: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
