"""A second provider plugs in through its entry point alone (issue 11 §2 proof).

``filedrop`` (tests/fixtures/filedrop/switchyard_filedrop.py) is a tiny
provider shipped as its own distribution: the test writes it into a temporary
site directory next to a ``dist-info`` whose ``entry_points.txt`` registers it
in the ``switchyard.providers`` group (tests/filedrop.py), and puts that
directory on the ``PYTHONPATH`` of the real bridge and Celery worker processes
(tests/cairn_stack.py). No Switchyard module names it. It serves fetch_source
from a file drop on loopback (the fake below, behind a bearer token) and
declares per-minute and per-hour rate windows instead of Strava's 15-minute
and daily ones. What must hold: the dev core ingests its claim-checked
result, and the shared ``cairn_rate_limits`` KV holds *its* windows, under
its provider name and the connection's app id.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.kit.cairn_stack import WAIT_S, CairnStack
from tests.kit.filedrop import (
    APP_CLIENT_ID,
    DISTRIBUTION,
    MODULE,
    PROVIDER,
    TOKEN_LIFETIME,
    FileDrop,
    install_distribution,
)
from workers.providers.registry import get_provider, provider_names

pytestmark = pytest.mark.xdist_group("second_provider")  # one xdist worker: its module-scoped stack starts once


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_distribution(tmp_path_factory.mktemp("site-packages"))


@pytest.fixture(scope="module")
def drop() -> Iterator[FileDrop]:
    fake = FileDrop(token=f"fd-{uuid.uuid4().hex}")
    fake.server.start()
    yield fake
    fake.server.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_endpoint: str, site: Path,
          drop: FileDrop) -> Iterator[CairnStack]:
    s = CairnStack(tmp_path_factory.mktemp("second-provider"), redis_url, s3_endpoint, extra_env={
        "PYTHONPATH": str(site),  # the processes run from the repository root, which stays importable
        "CAIRN_PROVIDER": PROVIDER,
        "CAIRN_WORKER_PACKAGE": DISTRIBUTION,
        "CAIRN_FILEDROP_BASE_URL": drop.base_url,
    })
    try:
        s.start()
        s.start_worker()
        s.start_bridge()
        yield s
    finally:
        s.stop()


def test_registry_finds_the_provider_by_its_entry_point(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert PROVIDER not in provider_names()  # nothing in this repository knows it
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("CAIRN_FILEDROP_BASE_URL", "http://127.0.0.1:9")
    try:
        assert PROVIDER in provider_names()
        provider = get_provider(PROVIDER)
        assert type(provider).__module__ == MODULE and provider.name == PROVIDER
        assert [w.name for w in provider.rate_windows()] == ["minute", "hour"]
        assert provider.refresh_oauth(provider.new_http_client(), client_id="c", client_secret="s",
                                      refresh_token="r") is None  # the interface's default: cannot refresh
    finally:
        sys.modules.pop(MODULE, None)


@pytest.mark.slow
def test_fetch_source_is_ingested_and_spends_its_own_windows(stack: CairnStack, drop: FileDrop) -> None:
    core = stack.core
    assert core is not None
    acct = core.connect_account(PROVIDER, None, drop.token, f"rt-{uuid.uuid4().hex}",
                                datetime.now(UTC) + TOKEN_LIFETIME, worker_name=stack.pool,
                                external_id="drop-owner-1", client_id=APP_CLIENT_ID, client_secret="unused")
    job = {"job_id": f"job-{uuid.uuid4().hex[:10]}", "account_id": acct.account_id, "user_id": acct.user_id,
           "provider": PROVIDER, "ext_id": "f-101", "fetch_streams": False, "reason": "manual"}
    core.enqueue_job("fetch_source", job)

    def result() -> Any:
        return [r for r in core.ingested if r.msg_id == f"result:{job['job_id']}:d1"]

    core.router.wait(lambda: bool(result()), WAIT_S, "the filedrop activity result")
    (ingested,) = result()
    assert ingested.kind == "events" and ingested.claim_checked and ingested.provider == PROVIDER
    assert ingested.pool == stack.pool
    data = ingested.data
    assert (data["workerName"], data["workerVersion"], data["workerPackage"]) == (stack.pool, "1.0", DISTRIBUTION)
    (event,) = data["events"]
    activity = event["activity"]
    assert activity["ref"] == {"userId": acct.user_id, "provider": PROVIDER,
                               "externalAccountId": acct.account_id, "externalId": "f-101"}
    assert activity["payload"]["type"] == "ACTIVITY_TYPE_RUN" and activity["payload"]["elapsedDuration"] == "1800s"
    assert activity["rawBlobId"] and activity["rawContentType"] == "application/json"  # archived before the result
    assert drop.requests == ["/files/f-101"]  # one call, with the token core handed out

    # The shared budget: this provider's windows, keyed by provider and app, at its declared capacities.
    prefix = f"{PROVIDER}.{acct.app_id}."
    budget = core.rate_limits()
    ours = {key[len(prefix):]: state for key, state in budget.items() if key.startswith(prefix)}
    assert set(ours) == {"minute", "hour"}
    assert (ours["minute"]["capacity"], ours["minute"]["used"]) == (30, 1)
    assert (ours["hour"]["capacity"], ours["hour"]["used"]) == (600, 1)
    assert not [k for k in budget if k.startswith("strava.")]
    window = datetime.fromisoformat(ours["minute"]["window_reset_at"]) - datetime.fromisoformat(
        ours["minute"]["window_start"])
    assert window == timedelta(seconds=60)  # its own window length, not Strava's 15 minutes

    # The bridge made consumers for what the provider declared, on its own subjects.
    filters = {c["filter_subject"] for c in core.consumers()}
    for kind in ("fetch_source", "reconcile", "parse_blob"):
        assert f"cairn.jobs.{kind}.{PROVIDER}.{stack.pool}" in filters
