"""``python -m bridges voicy|cairn``: run one bridge process until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from workers.config import load_settings
from workers.errors import ConfigError
from workers.logs import setup_logging

log = logging.getLogger("bridges")
EXIT_CONFIG_ERROR = 2


# Each bridge imports its own side inside its runner: a Voicy bridge never loads nats-py and the
# Cairn contract code, a Cairn bridge never loads the Voicy pipeline; and a bad value read while
# ``tasks`` is imported is a ConfigError that main() turns into one line.
def _run_voicy() -> None:
    # Function-level on purpose: only the Voicy side, and inside main()'s ConfigError handler.
    from bridges.voicy import VoicyBridge
    from tasks.settings import FleetSettings
    from tasks.voicy import dispatch_download, dispatch_transcription
    from workers.voicy.pipeline import VoicyRuntime

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
    setup_logging()
    try:
        {"voicy": _run_voicy, "cairn": _run_cairn}[args.bridge]()
    except ConfigError as exc:
        print(f"switchyard {args.bridge} bridge: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
