"""C5 in the Procfile deployment itself: an idle pool stays present, and nothing piles up in Redis.

The Procfile's own ``beat`` and ``provider`` command lines run (like honcho and
Heroku run them, ``tests.test_procfile.ProcfileProcess``) against nats-server
with the dev Cairn core, for longer than 60 s with no job. Each presence
interval (the contract's default, 20 s) must bring a newer ``last_seen``, the
record must stay inside core's 45 s window throughout, and Redis must hold no
``bcast.*`` queue nor any list that grows: the former design's beat broadcast
piled its messages into such lists and never reached the pool.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from deploy.devstack.cairn_core.scheduler import PRESENCE_LIVE_S
from tests.kit.cairn_stack import CairnStack
from tests.kit.procfile import ProcfileProcess, fleet_env
from tests.kit.waiting import wait_until
from workers.cairn.settings import DEFAULT_PRESENCE_INTERVAL_S

pytestmark = pytest.mark.slow  # starts fleet processes (tests/kit/fleet_guard.py)

OBSERVE_S = 65.0  # > 60 s: at least three presence intervals of the default 20 s
SAMPLE_INTERVAL_S = 1.0  # how often the test reads core's presence bucket
START_TIMEOUT_S = 60.0
MIN_ADVANCES = int(OBSERVE_S // DEFAULT_PRESENCE_INTERVAL_S)
# A renewal may come up to one interval late plus the write itself, and must stay inside core's window.
MAX_GAP_S = DEFAULT_PRESENCE_INTERVAL_S * 1.5
WEBHOOK_PRESENCE_INTERVAL_S = 2.0  # the default cadence is the test above's; here renewal is the point


@pytest.fixture()
def stack(tmp_path: Path, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    s = CairnStack(tmp_path, redis_url, s3_endpoint).start()
    try:
        yield s
    finally:
        s.stop()


def _seen(record: dict[str, object]) -> datetime:
    return datetime.fromisoformat(str(record["last_seen"]).replace("Z", "+00:00"))


def _lists(client: redis.Redis) -> dict[bytes, int]:
    return {key: int(client.llen(key)) for key in client.scan_iter() if client.type(key) == b"list"}


def test_an_idle_pool_renews_presence_on_every_interval_from_the_procfile_lines(
        stack: CairnStack, launch: Callable[..., ProcfileProcess]) -> None:  # noqa: F811
    assert stack.core is not None
    env = fleet_env(stack.redis_url, **{k: v for k, v in stack.env.items() if k.startswith("CAIRN_")},
                    HONCHO_PROCESS_NAME="provider.1", PROVIDER_CONCURRENCY="1")
    assert "CAIRN_PRESENCE_INTERVAL_S" not in env  # the deployment's default cadence
    beat = launch("beat", fleet_env(stack.redis_url, **{k: v for k, v in stack.env.items()
                                                        if k.startswith("CAIRN_")}))
    provider = launch("provider", env)
    beat.wait_for_output(r"beat: Acquired lock", START_TIMEOUT_S)
    provider.wait_for_output(r"cairn presence: instance \S+ renews its record", START_TIMEOUT_S)
    records = wait_until(lambda: stack.core.presence(stack.pool), START_TIMEOUT_S, "the first presence record")
    (key,) = records  # type: ignore[misc]  # one instance, one record
    client = redis.Redis.from_url(stack.redis_url)
    baseline_lists = _lists(client)

    seen = [_seen(records[key])]  # type: ignore[index]
    deadline = time.monotonic() + OBSERVE_S
    while time.monotonic() < deadline:
        assert provider.proc.poll() is None and beat.proc.poll() is None, provider.output()[-3000:]
        record = stack.core.presence(stack.pool)[key]
        assert stack.core.live_presence(stack.pool).get(key), f"stale for core ({PRESENCE_LIVE_S}s): {record}"
        if _seen(record) != seen[-1]:
            seen.append(_seen(record))
        time.sleep(SAMPLE_INTERVAL_S)  # sampling a KV bucket: no event to await

    gaps = [(b - a).total_seconds() for a, b in zip(seen, seen[1:])]
    assert len(gaps) >= MIN_ADVANCES, f"last_seen advanced {len(gaps)} times in {OBSERVE_S}s: {seen}"
    assert seen == sorted(seen) and max(gaps) <= MAX_GAP_S, gaps
    assert "Task cairn.job[" not in provider.output()  # idle: no job kept it present
    print(f"presence gaps (s): {gaps}")

    assert not [k for k in client.scan_iter() if b"bcast" in k], "a broadcast queue exists in Redis"
    grown = {k: n for k, n in _lists(client).items() if n > baseline_lists.get(k, 0)}
    assert not grown, f"lists grew in Redis: {grown}"
    client.close()


def test_with_webhooks_on_presence_says_so_and_is_renewed_from_the_procfile_lines(
        stack: CairnStack, launch: Callable[..., ProcfileProcess]) -> None:  # noqa: F811
    """Issue 14: with a verify token (the normal Strava deployment) the main process's presence
    context lacked what the webhook flag reads, and no record was ever written (AttributeError)."""
    assert stack.core is not None
    cairn = {k: v for k, v in stack.env.items() if k.startswith("CAIRN_")}
    cairn |= {"CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN": "wh-" + uuid.uuid4().hex,
              "CAIRN_PRESENCE_INTERVAL_S": str(WEBHOOK_PRESENCE_INTERVAL_S)}
    bridge = launch("cairn_bridge", fleet_env(stack.redis_url, **cairn))
    provider = launch("provider", fleet_env(stack.redis_url, **cairn, HONCHO_PROCESS_NAME="provider.1",
                                            PROVIDER_CONCURRENCY="1"))
    bridge.wait_for_output(r"cairn bridge started", START_TIMEOUT_S)  # it creates the webhook consumer
    provider.wait_for_output(r"cairn presence: instance \S+ renews its record", START_TIMEOUT_S)

    def flagged() -> dict[str, Any]:
        return {k: r for k, r in stack.core.presence(stack.pool).items() if r.get("webhooks") is True}

    # Sampled, not polled hard: each read of the bucket lists its keys through a consumer.
    first = wait_until(flagged, START_TIMEOUT_S, 'a presence record with "webhooks": true', SAMPLE_INTERVAL_S)
    (key, record), = first.items()  # type: ignore[union-attr]
    wait_until(lambda: _seen(flagged().get(key) or record) > _seen(record), START_TIMEOUT_S,
               "the record renewed, still flagged", SAMPLE_INTERVAL_S)
    assert "presence write failed" not in provider.output()


def test_a_bad_presence_interval_stops_the_provider_line_at_start_naming_it(
        redis_url: str, launch: Callable[..., ProcfileProcess]) -> None:  # noqa: F811
    """Beat no longer reads the period, so the provider worker must refuse it itself, before it runs."""
    env = fleet_env(redis_url, CAIRN_NATS_URL="nats://127.0.0.1:9", CAIRN_PRESENCE_INTERVAL_S="60",
                    HONCHO_PROCESS_NAME="provider.bad")
    provider = launch("provider", env)
    assert provider.wait_exit() == 2
    assert "CAIRN_PRESENCE_INTERVAL_S" in provider.output()
    assert " ready." not in provider.output()
