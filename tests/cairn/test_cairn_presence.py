"""Presence and manifest against the dev core: what they declare, and when they are not written.

Real nats-server (KV buckets created by the dev core), our presence/manifest
writers with the real Strava provider, and the dev core's scheduler reading
them. Two contract rules:

* §3/§4: core publishes ``import_gear`` only when a *live* worker of the pool
  declares Gear in its *manifest*; the manifest carries the same capabilities
  map as presence.
* §1: a worker MUST refuse to run against an incompatible core, so the pool
  stops advertising itself (no presence, no manifest) while core's ``info``
  names such a release; dev builds are exempt; no ``info`` → warn and write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devstack.fakes.cairn_core import DevCairnCore
from devstack.fakes.strava import FakeStrava
from tests.kit.cairn_ctx import PROVIDER, Athlete, job_context
from workers.cairn import presence
from workers.cairn.compat import CORE_CHECK_TTL_S, CoreGate
from workers.cairn.handlers import JobContext

COMPATIBLE = "v0.7.3"  # our release is v0.7.x: patch levels are free before 1.0
INCOMPATIBLE = "v0.9.0"


class Clock:
    """Monotonic seconds the test moves by hand, so the gate's TTL is visible without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def pass_ttl(self) -> None:
        self.now += CORE_CHECK_TTL_S + 1


@pytest.fixture()
def clock() -> Clock:
    return Clock()


@pytest.fixture()
def gated(ctx: JobContext, clock: Clock, core: DevCairnCore) -> Iterator[JobContext]:
    """``ctx`` with a gate on the test clock; core's release is restored afterwards."""
    ctx._core_gate = CoreGate(ctx.settings.release, clock=clock)
    try:
        yield ctx
    finally:
        core.set_release("v0.7.0")


def stored(core: DevCairnCore, pool: str) -> tuple[dict[str, Any], Any]:
    return core.presence(pool), core.manifests().get(pool)


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and "incompatible" in r.getMessage()]


# --------------------------------------------------------------------------- capabilities


LIVE_PRESENCE_WAIT_S = 15.0  # bound on core seeing the pool's presence record as live


def test_manifest_carries_the_presence_capabilities_and_gates_import_gear(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, pool: str) -> None:
    ath = Athlete(core, strava, pool, n=0)
    record = presence.write_presence(ctx, "one")
    assert record is not None
    jobs = core.schedule_reconcile(ath.account_id, force=True)
    assert [j.subject.split(".")[2] for j in jobs] == ["reconcile"]  # presence alone declares nothing
    manifest = presence.write_manifest(ctx)
    assert manifest is not None and manifest["capabilities"] == record["capabilities"]
    assert manifest["capabilities"]["Gear"] == {"read": True, "write": False, "backfill": False}
    assert core.manifests()[pool]["capabilities"] == manifest["capabilities"]  # as stored in KV
    # The worker's timer rewrites presence every interval; a write that met a NATS reconnect (a
    # restart by an earlier test of the session) is simply written again, as the timer would.
    deadline = time.monotonic() + LIVE_PRESENCE_WAIT_S
    while True:
        jobs = core.schedule_reconcile(ath.account_id, force=True)
        gear = [j for j in jobs if j.subject == f"cairn.jobs.import_gear.{PROVIDER}.{pool}"]
        if gear or time.monotonic() > deadline:
            break
        presence.write_presence(ctx, "one")
        time.sleep(0.2)  # poll interval while core does not yet see the rewritten record
    assert len(gear) == 1 and gear[0].payload["account_id"] == ath.account_id


def test_a_manifest_without_a_live_worker_schedules_no_gear(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, pool: str) -> None:
    ath = Athlete(core, strava, pool, n=0)
    assert presence.write_manifest(ctx) is not None  # the pool stopped: no presence record
    jobs = core.schedule_reconcile(ath.account_id, force=True)
    assert [j.subject.split(".")[2] for j in jobs] == ["reconcile"]


# --------------------------------------------------------------------------- core release gate


def test_nothing_is_advertised_to_an_incompatible_core_and_the_refusal_is_logged_once(
        core: DevCairnCore, gated: JobContext, clock: Clock, pool: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="workers.cairn.compat")
    core.set_release(INCOMPATIBLE)
    assert presence.write_presence(gated, "a") is None and presence.write_manifest(gated) is None
    clock.pass_ttl()  # re-read: same verdict, no second error
    assert presence.write_presence(gated, "a") is None
    assert stored(core, pool) == ({}, None)
    assert len(refusals(caplog)) == 1 and INCOMPATIBLE in refusals(caplog)[0]

    core.set_release("v0.9.1")  # another incompatible release: a change, logged once more
    clock.pass_ttl()
    assert presence.write_manifest(gated) is None
    assert len(refusals(caplog)) == 2 and "v0.9.1" in refusals(caplog)[1]

    core.set_release(COMPATIBLE)
    assert presence.write_presence(gated, "a") is None  # cached for CORE_CHECK_TTL_S: no KV read yet
    clock.pass_ttl()
    assert presence.write_presence(gated, "a") is not None and presence.write_manifest(gated) is not None
    records, manifest = stored(core, pool)
    assert set(records) == {f"{pool}.a"} and manifest["worker_name"] == pool
    assert any("written again" in r.getMessage() for r in caplog.records)
    assert len(refusals(caplog)) == 2


def test_dev_builds_are_exempt_and_a_core_without_info_only_warns(
        core: DevCairnCore, nats_url: str, fresh_redis: str, strava: FakeStrava, pool: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="workers.cairn.compat")
    core.set_release(INCOMPATIBLE)
    try:
        with job_context(nats_url, fresh_redis, strava, pool, release="dev") as dev:
            assert presence.write_presence(dev, "dev") is not None
        core.kv_delete("cairn_core", "info")
        with job_context(nats_url, fresh_redis, strava, pool) as plain:
            assert presence.write_manifest(plain) is not None
    finally:
        core.set_release("v0.7.0")
    assert f"{pool}.dev" in core.presence(pool) and pool in core.manifests()
    assert not refusals(caplog)
    assert any("publishes no release" in r.getMessage() for r in caplog.records)

