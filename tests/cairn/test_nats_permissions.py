"""The pool under production NATS permissions (contract §1, issue 14).

Under auth-callout a worker MUST stay within core's standard permission
template; anything else is refused with ``Permissions Violation``. The dev
stack's nats-server holds exactly that template for the pool's ``worker`` user
(``devstack.infra.nats_auth``), and the fleet logs in as that user. Here every
job kind the pool serves, both responders and every webhook path run through
the real bridge and provider workers, and the server's log must show no
refusal at all; then a subject the template withholds must be reported once,
loudly, recorded for the health verdict, and never NAK-looped, and a refused
consumer creation must stop the bridge with one line and leave its job alone.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import redis

from devstack.fakes.cairn_core.accounts import utcnow
from devstack.infra import services
from tests.kit.cairn_stack import ATHLETE_BASE, PROVIDER, WAIT_S, CairnStack
from tests.kit.waiting import wait_until
from workers.cairn.contract import subjects
from workers.faults import read_faults

# slow: starts fleet processes (tests/kit/fleet_guard.py); one xdist worker runs the module, whose
# module-scoped stack is then started once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("nats_permissions")]

VERIFY_TOKEN = "perm-verify-" + uuid.uuid4().hex
COALESCE_S = 1.0
PRESENCE_INTERVAL_S = 2.0  # the flag turns true on the first write after the bridge made its consumer
SLOW_WAIT_S = 60.0  # a reconcile and its sub-jobs, several webhook round trips
BRIDGE_EXIT_S = 30.0


def stepping_clock() -> Any:
    """Core's received-at one second later on each forward: its webhook msg id has one-second
    resolution, and two pushes within a second would be deduplicated (a defect the dev core keeps)."""
    steps = itertools.count(1)
    return lambda: utcnow() + timedelta(seconds=next(steps))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    s = CairnStack(tmp_path_factory.mktemp("nats-perm"), redis_url, s3_endpoint,
                   extra_env={"CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN": VERIFY_TOKEN,
                              "CAIRN_STRAVA_WEBHOOK_COALESCE_S": str(COALESCE_S),
                              "CAIRN_PRESENCE_INTERVAL_S": str(PRESENCE_INTERVAL_S)}).start()
    try:
        s.core.clock = stepping_clock()
        s.start_worker(concurrency=2)
        s.start_bridge()
        yield s
    finally:
        s.stop()


def _worker_key(stack: CairnStack) -> str:
    return subjects.worker_key(stack.pool, PROVIDER)


def _subscribe(stack: CairnStack, client_id: str, client_secret: str) -> None:
    """Strava's push subscription: its handshake travels core HTTP → ``.verify`` → the bridge and back."""
    resp = httpx.post(stack.strava.api_url + "/push_subscriptions",
                      data={"client_id": client_id, "client_secret": client_secret, "verify_token": VERIFY_TOKEN,
                            "callback_url": stack.core.webhook_url(_worker_key(stack))})
    assert resp.status_code == 201, resp.text


def _publish(stack: CairnStack, subject: str, body: bytes) -> None:
    async def run() -> None:
        nc = await nats.connect(stack.nats.url)  # anonymous: core's user
        try:
            await nc.jetstream().publish(subject, body, headers={"Nats-Msg-Id": f"raw:{uuid.uuid4().hex}"})
        finally:
            await nc.close()
    asyncio.run(run())


def _events(stack: CairnStack, ext_id: object, prefix: str = "result:") -> list[Any]:
    return [r for r in stack.core.ingested if r.kind == "events" and (r.msg_id or "").startswith(prefix)
            and f":{ext_id}:" in (r.msg_id or "")]


def _failures(stack: CairnStack, code: str) -> list[Any]:
    return [r for r in stack.core.ingested if r.kind == "failure" and r.data["error"]["code"] == code]


def _drained(stack: CairnStack) -> bool:
    consumers = [c for c in stack.core.consumers() if c["filter_subject"].endswith(f".{stack.pool}")]
    consumers += [c for c in stack.core.consumers(subjects.WEBHOOKS_STREAM)
                  if c["durable_name"] == subjects.webhook_durable_name(stack.pool)]
    return bool(consumers) and all(c["num_pending"] == 0 and c["num_ack_pending"] == 0 for c in consumers)


def test_every_job_kind_responder_and_webhook_path_stays_within_the_template(stack: CairnStack) -> None:
    core, strava = stack.core, stack.strava
    assert core is not None and strava is not None
    acct = stack.connect_athlete(n_activities=2, own_app=True)
    owner = int(acct.external_id)
    _subscribe(stack, acct.client_id, acct.client_secret)  # webhook verify
    wait_until(lambda: core.manifests().get(stack.pool), WAIT_S, "the pool's manifest", 0.5)
    wait_until(lambda: any(r.get("webhooks") is True for r in core.live_presence(stack.pool).values()),
               WAIT_S, 'live presence with "webhooks": true', 0.5)  # once the bridge made the consumer

    # Core schedules import_gear once its own read of the pool's manifest and presence shows Gear declared by a
    # live worker; on a loaded box that read can trail the test's own (a full run once scheduled no import_gear).
    wait_until(lambda: "Gear" in core.pool_capabilities(acct.provider, stack.pool), WAIT_S,
               "core seeing the pool declare Gear", 0.5)
    # reconcile (its fetch_source sub-jobs on the pool's own subject) and import_gear, as core schedules them
    jobs = core.schedule_reconcile(acct.account_id, force=True)
    assert sorted(j.subject.split(".")[2] for j in jobs) == ["import_gear", "reconcile"]
    activities = sorted(strava.athlete(owner).activities)
    for job in jobs:
        core.router.wait(partial(stack.has_result, job.payload["job_id"]), SLOW_WAIT_S, job.subject)
    core.router.wait(lambda: all(_events(stack, a) for a in activities), SLOW_WAIT_S, "every activity imported")

    # parse_blob from the archive, its URL expired: the pool re-presigns the download
    raw_key = _events(stack, activities[0])[0].data["events"][-1]["activity"]["rawBlobId"]
    reparse = stack.fetch_job(acct, str(activities[0])) | {
        "min_parser_version": "1.0",
        "blob": {"url": "http://127.0.0.1:9/gone", "expires_at": "2020-01-01T00:00:00Z", "fallback_handle": raw_key}}
    core.enqueue_job("parse_blob", reparse)
    core.router.wait(lambda: bool(stack.results_for(reparse["job_id"])), SLOW_WAIT_S, "the parse_blob result")

    # both responders
    assert core.discover(acct.account_id).get("items")
    newcomer = ATHLETE_BASE + 900
    strava.add_athlete(newcomer, n_activities=0, with_gear=False)
    linked = core.oauth_exchange(PROVIDER, stack.pool, strava.issue_code(newcomer), strava.client_id,
                                 strava.client_secret, "http://127.0.0.1/auth/oauth/strava/callback")
    assert linked.external_id == str(newcomer)

    # webhooks: create, update, delete (reported through the contract's failure envelope), deauthorize
    created = strava.create_activity(owner)["id"]
    core.router.wait(lambda: bool(_events(stack, created, "result:webhook:")), SLOW_WAIT_S, "the created activity")
    strava.update_activity(owner, created, title="renamed")
    core.router.wait(lambda: len(_events(stack, created, "result:webhook:")) >= 2, SLOW_WAIT_S, "the update")
    strava.remove_activity(owner, created)
    core.router.wait(lambda: any(f.data["failedRef"]["externalId"] == str(created)
                                 for f in _failures(stack, "not_found")), SLOW_WAIT_S, "the deletion's envelope")
    strava.deauthorize(owner)
    wait_until(lambda: any(e.get("account_id") == acct.account_id for e in core.reauth_events), WAIT_S,
               "core's needs_reauth event")

    # poison: a job gets the bridge's envelope + term; a webhook event (no import-queue item) a term
    poisoned = len(_failures(stack, "bad_payload"))
    stack.publish_raw("fetch_source", b"{not json")
    core.router.wait(lambda: len(_failures(stack, "bad_payload")) > poisoned, WAIT_S, "the poison's envelope")
    _publish(stack, subjects.webhook_event_subject(_worker_key(stack)), b"not an envelope")
    bridge = stack.bridge
    assert bridge is not None
    wait_until(lambda: "term webhook_event seq" in bridge.log(), WAIT_S, "the poison event termed")
    wait_until(lambda: _drained(stack), SLOW_WAIT_S, "every message decided", 0.5)

    assert stack.nats_auth.violations() == []
    mine = [c for c in stack.nats_auth.connections() if c.get("name") == stack.pool]
    assert len(mine) >= 3, mine  # the bridge, the worker's main process, its pool processes
    assert {c.get("authorized_user") for c in mine} == {"worker"}
    assert not [r for r in core.ingested if "webhook_event" in (r.subject or "")]
    assert "Permissions Violation" not in stack.all_logs() and "permissions violation" not in stack.all_logs()


@pytest.fixture()
def own_redis(tmp_path: Path) -> Iterator[str]:
    """A Redis of the test's own: the module's stack keeps its workers on the session Redis's
    ``provider`` queue, and they would take this test's tasks (to another NATS and core)."""
    svc = services.start_redis(tmp_path / "redis")
    try:
        yield svc.url
    finally:
        svc.stop()


def test_a_refused_subject_is_reported_once_recorded_and_never_nak_looped(
        tmp_path: Path, own_redis: str, s3_endpoint: str) -> None:
    pool = f"sy-{uuid.uuid4().hex[:6]}"
    results = subjects.result_subject(subjects.FETCH_SOURCE, PROVIDER, pool)
    stack = CairnStack(tmp_path, own_redis, s3_endpoint, pool=pool, nats_withheld=(results,)).start()
    try:
        stack.start_worker(concurrency=1)  # one pool process: "once" is per process
        bridge = stack.start_bridge()
        acct = stack.connect_athlete(n_activities=2)
        for ext_id in sorted(stack.strava.athlete(int(acct.external_id)).activities):
            stack.core.enqueue_job("fetch_source", stack.fetch_job(acct, str(ext_id)))
        wait_until(lambda: bridge.log().count("term fetch_source seq") == 2, SLOW_WAIT_S,
                   "both jobs termed")
        assert bridge.log().count(": permission_refused: ") == 2
        consumer = stack.consumer("fetch_source")
        assert consumer["num_redelivered"] == 0 and consumer["num_pending"] == 0, consumer
        assert " nak fetch_source" not in bridge.log()

        logs = stack.all_logs()
        refusals = [line for line in logs.splitlines() if "ERROR" in line and results in line]
        assert len(refusals) == 1, refusals
        assert "NATS unavailable" not in logs
        faults = read_faults(redis.Redis.from_url(own_redis))
        assert [f for f in faults if pool in f.component and results in f.detail], faults
        assert [v for v in stack.nats_auth.violations() if results in v]  # it really was refused
    finally:
        stack.stop()


def test_a_refused_consumer_creation_stops_the_bridge_with_one_line_and_leaves_the_job(
        tmp_path: Path, own_redis: str, s3_endpoint: str) -> None:
    pool = f"sy-{uuid.uuid4().hex[:6]}"
    create = (f"$JS.API.CONSUMER.CREATE.{subjects.JOBS_STREAM}.{subjects.durable_name(pool, subjects.FETCH_SOURCE)}"
              f".{subjects.job_subject(subjects.FETCH_SOURCE, PROVIDER, pool)}")
    stack = CairnStack(tmp_path, own_redis, s3_endpoint, pool=pool, nats_withheld=(create,)).start()
    try:
        acct = stack.connect_athlete(n_activities=1)
        ext_id = str(sorted(stack.strava.athlete(int(acct.external_id)).activities)[0])
        job = stack.core.enqueue_job("fetch_source", stack.fetch_job(acct, ext_id))
        bridge = stack.spawn_bridge()
        assert bridge.proc.wait(BRIDGE_EXIT_S) != 0
        log = bridge.log()
        assert "Traceback" not in log and "NATS unavailable" not in log, log
        assert len([line for line in log.splitlines() if create in line]) == 1, log
        assert stack.core.stream_holds(job.seq)  # untouched: still in the work queue, for a fixed pool
        assert not [c for c in stack.core.consumers() if c["filter_subject"] == job.subject]
        faults = read_faults(redis.Redis.from_url(own_redis))
        assert [f for f in faults if pool in f.component and create in f.detail], faults
    finally:
        stack.stop()
