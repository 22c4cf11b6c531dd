"""Presence and manifest against the dev core: what they declare, and when they are not written.

Real nats-server (KV buckets created by the dev core), our presence/manifest
writers with the real Strava provider, and the dev core's scheduler reading
them. Contract §3/§4: core publishes ``import_gear`` only when a *live*
worker of the pool declares Gear in its *manifest*; the manifest carries the
same capabilities map as presence.
"""

from __future__ import annotations

from deploy.devstack.cairn_core import DevCairnCore
from deploy.devstack.strava import FakeStrava
from tests.cairn_ctx import PROVIDER, Athlete, core, ctx, pool, strava  # noqa: F401
from workers.cairn import presence
from workers.cairn.handlers import JobContext


# --------------------------------------------------------------------------- capabilities


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
    jobs = core.schedule_reconcile(ath.account_id, force=True)
    gear = [j for j in jobs if j.subject == f"cairn.jobs.import_gear.{PROVIDER}.{pool}"]
    assert len(gear) == 1 and gear[0].payload["account_id"] == ath.account_id


def test_a_manifest_without_a_live_worker_schedules_no_gear(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, pool: str) -> None:
    ath = Athlete(core, strava, pool, n=0)
    assert presence.write_manifest(ctx) is not None  # the pool stopped: no presence record
    jobs = core.schedule_reconcile(ath.account_id, force=True)
    assert [j.subject.split(".")[2] for j in jobs] == ["reconcile"]
