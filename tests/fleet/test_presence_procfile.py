"""C5 in the Procfile deployment itself: an idle pool stays present, and nothing piles up in Redis.

The Procfile's own ``beat`` and ``provider`` command lines run (like honcho and
Heroku run them, ``tests.kit.procfile.ProcfileProcess``) against nats-server
with the dev Cairn core, for four presence intervals with no job. Each interval
must bring a newer ``last_seen``, the record must stay inside core's 45 s window
throughout, and Redis must hold no ``bcast.*`` queue nor any list that grows:
the former design's beat broadcast piled its messages into such lists and never
reached the pool.

The interval is shortened through the deployment's own variable,
``CAIRN_PRESENCE_INTERVAL_S=5`` (the contract's default is 20 s), so four
intervals take 21 s instead of 65 s. What the test proves does not depend on
the length: the timer renews once per configured interval, from the Procfile
line, with nothing else running. That the default is the contract's 20 s and
fits core's window is checked without waiting for it (the last test here).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import redis

from devstack.fakes.cairn_core.scheduler import PRESENCE_LIVE_S
from tests.kit.cairn_stack import CairnStack, started_stack
from tests.kit.procfile import ProcfileProcess, fleet_env
from tests.kit.waiting import wait_until
from workers.cairn.settings import DEFAULT_PRESENCE_INTERVAL_S, CairnTimings

# slow: starts fleet processes (tests/kit/fleet_guard.py); H1: each test's processes end with an empty
# log budget (tests/conftest.py ``log_budget``).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("log_budget")]

PRESENCE_INTERVAL_S = 5.0  # CAIRN_PRESENCE_INTERVAL_S here; the deployment's default is 20 s
OBSERVE_S = 4 * PRESENCE_INTERVAL_S + 1.0  # four intervals
SAMPLE_INTERVAL_S = 0.5  # how often the test reads core's presence bucket
START_TIMEOUT_S = 60.0
MIN_ADVANCES = 3  # of the four due: one renewal may slip past the end of the window on a loaded box
# A renewal may come up to one interval late plus the write itself; the record must stay inside core's window.
MAX_GAP_S = PRESENCE_INTERVAL_S + 5.0
WEBHOOK_PRESENCE_INTERVAL_S = 2.0  # the flag and one renewal are the point here, not the cadence


@pytest.fixture()
def stack(tmp_path: Path, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    with started_stack(tmp_path, redis_url, s3_endpoint) as s:
        yield s


def _seen(record: dict[str, object]) -> datetime:
    return datetime.fromisoformat(str(record["last_seen"]).replace("Z", "+00:00"))


def _lists(client: redis.Redis) -> dict[bytes, int]:
    return {key: int(client.llen(key)) for key in client.scan_iter() if client.type(key) == b"list"}


def test_an_idle_pool_renews_presence_on_every_interval_from_the_procfile_lines(
        stack: CairnStack, launch: Callable[..., ProcfileProcess]) -> None:
    env = fleet_env(stack.redis_url, **{k: v for k, v in stack.env.items() if k.startswith("CAIRN_")},
                    HONCHO_PROCESS_NAME="provider.1", PROVIDER_CONCURRENCY="1",
                    CAIRN_PRESENCE_INTERVAL_S=str(PRESENCE_INTERVAL_S))
    assert PRESENCE_INTERVAL_S < DEFAULT_PRESENCE_INTERVAL_S  # only the length of the test changes
    beat = launch("beat", fleet_env(stack.redis_url, **{k: v for k, v in stack.env.items()
                                                        if k.startswith("CAIRN_")}))
    provider = launch("provider", env)
    beat.wait_for_output(r"beat: Acquired lock", START_TIMEOUT_S)
    provider.wait_for_output(rf"cairn presence: instance \S+ renews its record every {PRESENCE_INTERVAL_S:.0f}s",
                             START_TIMEOUT_S)  # the variable reached the timer
    records = wait_until(lambda: stack.core.presence(stack.pool), START_TIMEOUT_S, "the first presence record")
    (key,) = records  # one instance, one record
    client = redis.Redis.from_url(stack.redis_url)
    baseline_lists = _lists(client)

    seen = [_seen(records[key])]
    deadline = time.monotonic() + OBSERVE_S
    while time.monotonic() < deadline:
        assert provider.proc.poll() is None and beat.proc.poll() is None, provider.output()[-3000:]
        record = stack.core.presence(stack.pool)[key]
        assert stack.core.live_presence(stack.pool).get(key), f"stale for core ({PRESENCE_LIVE_S}s): {record}"
        if _seen(record) != seen[-1]:
            seen.append(_seen(record))
        time.sleep(SAMPLE_INTERVAL_S)  # sampling a KV bucket: no event to await

    gaps = [(b - a).total_seconds() for a, b in pairwise(seen)]
    assert len(gaps) >= MIN_ADVANCES, f"last_seen advanced {len(gaps)} times in {OBSERVE_S}s: {seen}"
    assert seen == sorted(seen) and max(gaps) <= MAX_GAP_S, gaps
    assert "Task cairn.job[" not in provider.output()  # idle: no job kept it present
    print(f"presence gaps (s): {gaps}")

    assert not [k for k in client.scan_iter() if b"bcast" in k], "a broadcast queue exists in Redis"
    grown = {k: n for k, n in _lists(client).items() if n > baseline_lists.get(k, 0)}
    assert not grown, f"lists grew in Redis: {grown}"
    client.close()


def test_with_webhooks_on_presence_says_so_and_is_renewed_from_the_procfile_lines(
        stack: CairnStack, launch: Callable[..., ProcfileProcess]) -> None:
    """Issue 14: with a verify token (the normal Strava deployment) the main process's presence
    context lacked what the webhook flag reads, and no record was ever written (AttributeError)."""
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
    (key, record), = first.items()
    wait_until(lambda: _seen(flagged().get(key) or record) > _seen(record), START_TIMEOUT_S,
               "the record renewed, still flagged", SAMPLE_INTERVAL_S)
    assert "presence write failed" not in provider.output()


def test_a_bad_presence_interval_stops_the_provider_line_at_start_naming_it(
        redis_url: str, launch: Callable[..., ProcfileProcess]) -> None:
    """Beat no longer reads the period, so the provider worker must refuse it itself, before it runs."""
    env = fleet_env(redis_url, CAIRN_NATS_URL="nats://127.0.0.1:9", CAIRN_PRESENCE_INTERVAL_S="60",
                    HONCHO_PROCESS_NAME="provider.bad")
    provider = launch("provider", env)
    assert provider.wait_exit() == 2
    assert "CAIRN_PRESENCE_INTERVAL_S" in provider.output()
    assert " ready." not in provider.output()


def test_the_default_interval_is_the_contracts_and_leaves_core_a_late_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the shortened observation above does not run: the cadence a deployment gets without the variable."""
    monkeypatch.delenv("CAIRN_PRESENCE_INTERVAL_S", raising=False)
    interval = CairnTimings().presence_interval_s
    assert interval == DEFAULT_PRESENCE_INTERVAL_S == 20.0  # contract §2: every ~20 s
    assert interval * 1.5 <= PRESENCE_LIVE_S  # one renewal may come half an interval late and still count
