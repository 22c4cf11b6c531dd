"""A Voicy test stack: the dev Worker API and fake Telegram for one test, and this process as a fleet member.

The pieces the demo and the benchmarks share with the tests (fixtures, tiny
model, ``fleet_env``, ``start_bridge``, ``start_beat``) live in
``deploy.devstack.stack``; only test plumbing is here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from deploy.devstack.stack import BOT_TOKEN, VOICY_TOKEN_MARK, fleet_env


@contextmanager
def voicy_dev_stack(tmp_path: Path, redis_url: str, client: str,
                    **env_overrides: str) -> Iterator[tuple[Any, Any, dict[str, str]]]:
    """A started dev Voicy API and fake Telegram, a worker client named ``client`` with a
    distinctive token (``VOICY_TOKEN_MARK-<client>``), and the fleet environment for them."""
    from deploy.devstack.telegram import FakeTelegram
    from deploy.devstack.voicy_api import DevVoicyServer

    server = DevVoicyServer().start()
    telegram = FakeTelegram(BOT_TOKEN)
    telegram.start()
    try:
        token = server.create_client(f"switchyard-{client}", token=f"{VOICY_TOKEN_MARK}-{client}")
        env = fleet_env(redis_url=redis_url, api_url=server.url, token=token, telegram_url=telegram.url,
                        work_dir=tmp_path / "work", **env_overrides)
        yield server, telegram, env
    finally:
        telegram.clear_faults()
        telegram.stop()
        server.stop()


@contextmanager
def fleet_runtime(env: dict[str, str], monkeypatch: Any) -> Iterator[Any]:
    """This test process as one more fleet process (same Redis, Voicy server, media store) under ``env``'s
    ``VOICY_*`` settings; ``monkeypatch`` restores the process environment afterwards."""
    from workers.voicy.pipeline import VoicyRuntime

    for key in list(os.environ):
        if key.startswith("VOICY_") or key == "TOKEN":
            monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("VOICY_"):
            monkeypatch.setenv(key, value)
    runtime = VoicyRuntime.from_env(env["REDIS_URL"])
    try:
        yield runtime
    finally:
        runtime.client.close()
        runtime.redis.close()
