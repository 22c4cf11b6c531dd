"""Webhooks end to end (issue 10 §1): fake Strava → dev core HTTP → CAIRN_WEBHOOKS → bridge → pool → core.

Everything of ours is real: the bridge process (its webhook consumer and
verify responder), a Celery provider worker, nats-server with JetStream, Redis,
moto S3. Strava and core are the dev doubles: the fake Strava registers its
push subscription against the dev core's ``/webhooks/<worker_key>`` endpoint
(the handshake travels GET → core → ``.verify`` → the bridge and back) and
pushes its events there; core forwards them exactly as reference §2.13 says.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import nats
import pytest

from devstack.fakes.cairn_core import DevCairnCore, IngestedResult
from devstack.fakes.cairn_core.accounts import utcnow
from devstack.infra import services
from ops.cairn_check import CheckOptions, run_checks
from ops.cli import main
from tests.kit.cairn_ctx import job_context
from tests.kit.cairn_stack import PROVIDER, CairnStack
from tests.kit.waiting import wait_until
from workers.cairn import presence
from workers.cairn.contract import subjects
from workers.cairn.handlers import webhooks as wh

# slow: starts fleet processes (tests/kit/fleet_guard.py); one xdist worker runs the module, whose
# module-scoped stack is then started once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("webhooks")]

VERIFY_TOKEN = "wh-verify-" + uuid.uuid4().hex
COALESCE_S = 2.0
WAIT_S = 30.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    s = CairnStack(tmp_path_factory.mktemp("webhooks"), redis_url, s3_endpoint,
                   extra_env={"CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN": VERIFY_TOKEN,
                              "CAIRN_STRAVA_WEBHOOK_COALESCE_S": str(COALESCE_S)}).start()
    try:
        s.start_worker()
        s.start_bridge()
        s.core.start_webhooks_http()
        s.core.clock = stepping_clock()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def subscribed(stack: CairnStack) -> int:
    """The fake Strava app's push subscription, created through the real handshake."""
    return subscribe(stack, stack.strava.client_id, stack.strava.client_secret)


def stepping_clock() -> Any:
    """Core's received-at, one second later on every forward: core's msg id has one-second
    resolution, so two webhooks in one second collide and JetStream drops the second (core's
    defect, reproduced by the dev core); the tests push faster than that."""
    steps = itertools.count(1)
    return lambda: utcnow() + timedelta(seconds=next(steps))


def subscribe(stack: CairnStack, client_id: str, client_secret: str) -> int:
    """Create the app's push subscription against the dev core's endpoint (the real handshake)."""
    resp = httpx.post(stack.strava.api_url + "/push_subscriptions",
                      data={"client_id": client_id, "client_secret": client_secret,
                            "callback_url": stack.core.webhook_url(worker_key(stack)), "verify_token": VERIFY_TOKEN})
    assert resp.status_code == 201, resp.text
    return int(resp.json()["id"])


def webhook_athlete(stack: CairnStack, n_activities: int) -> Any:
    """A connected athlete with its own Strava app and that app's subscription.

    Cairn users bring their own app, and a Strava subscription is per app. Core
    resolves a webhook by ``subscription_id`` first (reference §2.8, reproduced by
    the dev core), so athletes sharing one app would all resolve to the first
    account that recorded the subscription.
    """
    acct = stack.connect_athlete(n_activities=n_activities, own_app=True)
    subscribe(stack, acct.client_id, acct.client_secret)
    return acct


def worker_key(stack: CairnStack) -> str:
    return subjects.worker_key(stack.pool, PROVIDER)


def webhook_consumer(stack: CairnStack) -> dict[str, Any] | None:
    return next((c for c in stack.core.consumers(subjects.WEBHOOKS_STREAM)
                 if c["durable_name"] == subjects.webhook_durable_name(stack.pool)), None)


def drained(stack: CairnStack) -> bool:
    """Every webhook and fetch_source message was decided (nothing pending or held)."""
    wc, fc = webhook_consumer(stack), stack.consumer("fetch_source")
    return bool(wc and wc["num_pending"] == 0 and wc["num_ack_pending"] == 0
                and fc["num_pending"] == 0 and fc["num_ack_pending"] == 0)


def activity_results(stack: CairnStack, ext_id: str | int, kinds: tuple[str, ...] = ("events",)) -> list[Any]:
    return [r for r in stack.core.ingested if r.kind in kinds and r.msg_id
            and f":{ext_id}:" in r.msg_id and r.msg_id.startswith("result:webhook:")]


def detail_calls(stack: CairnStack, activity_id: int) -> int:
    return sum(1 for r in stack.strava.requests if r.endpoint == "activity"
               and r.path.endswith(f"/activities/{activity_id}"))


def publish_raw_webhook(stack: CairnStack, data: bytes) -> None:
    async def run() -> None:
        nc = await nats.connect(stack.nats.url)
        try:
            await nc.jetstream().publish(subjects.webhook_event_subject(worker_key(stack)), data,
                                         headers={"Nats-Msg-Id": f"raw:{uuid.uuid4().hex}"})
        finally:
            await nc.close()
    asyncio.run(run())


# --------------------------------------------------------------------------- verify


def test_the_subscription_handshake_passes_with_the_right_token(stack: CairnStack, subscribed: int) -> None:
    listed = httpx.get(stack.strava.api_url + "/push_subscriptions",
                       params={"client_id": stack.strava.client_id, "client_secret": stack.strava.client_secret})
    assert listed.status_code == 200 and [s["id"] for s in listed.json()] == [subscribed]
    status, ctype, body = stack.core.relay_verify(worker_key(stack), {
        "hub.mode": "subscribe", "hub.challenge": "abc123", "hub.verify_token": VERIFY_TOKEN})
    assert (status, ctype, json.loads(body)) == (200, "application/json", {"hub.challenge": "abc123"})
    raw = stack.core.verify_webhook(worker_key(stack), {"hub.mode": "subscribe", "hub.challenge": "x",
                                                        "hub.verify_token": VERIFY_TOKEN})
    assert set(raw) == {"status", "content_type", "body"} and base64.b64decode(raw["body"]) == b'{"hub.challenge": "x"}'


def test_a_wrong_token_is_refused_with_403_and_strava_refuses_the_subscription(stack: CairnStack) -> None:
    url = stack.core.webhook_url(worker_key(stack))
    resp = httpx.get(url, params={"hub.mode": "subscribe", "hub.challenge": "c", "hub.verify_token": "wrong"})
    assert resp.status_code == 403 and VERIFY_TOKEN not in resp.text
    assert httpx.get(url, params={"hub.mode": "unsubscribe", "hub.verify_token": VERIFY_TOKEN}).status_code == 400
    other_app, secret = "app-wrong-token", "s-" + uuid.uuid4().hex
    stack.strava.add_app(other_app, secret)
    resp = httpx.post(stack.strava.api_url + "/push_subscriptions",
                      data={"client_id": other_app, "client_secret": secret, "callback_url": url,
                            "verify_token": "wrong"})
    assert resp.status_code == 400 and "callback" in resp.text


def test_a_pool_without_a_token_answers_503_and_creates_no_consumer(stack: CairnStack) -> None:
    pool = f"nt-{uuid.uuid4().hex[:6]}"
    env = stack.env | {"CAIRN_WORKER_NAME": pool} | services.nats_login(stack.nats, PROVIDER, pool).env()
    env.pop("CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN")
    bridge = stack.spawn_bridge("bridge-no-token", env)
    try:
        wait_until(lambda: "cairn bridge started" in bridge.log(), WAIT_S, "the token-less bridge")
        resp = httpx.get(stack.core.webhook_url(f"{pool}-{PROVIDER}"),
                         params={"hub.mode": "subscribe", "hub.challenge": "c", "hub.verify_token": "anything"})
        assert resp.status_code == 503
        assert all(c["durable_name"] != subjects.webhook_durable_name(pool)
                   for c in stack.core.consumers(subjects.WEBHOOKS_STREAM))
    finally:
        bridge.stop()
    # nobody answers at all: core's own 503 after its 3 s relay timeout
    assert httpx.get(stack.core.webhook_url(f"{pool}-{PROVIDER}"), params={"hub.mode": "subscribe"},
                     timeout=10).status_code == 503


# --------------------------------------------------------------------------- events


def test_create_is_fetched_with_a_deterministic_job_id_on_the_webhook_budget(
        stack: CairnStack, subscribed: int) -> None:
    acct = webhook_athlete(stack, 1)
    owner = int(acct.external_id)
    pushed_at = time.monotonic()
    act = stack.strava.create_activity(owner, photos=1, segments=2)
    results = wait_until(lambda: len(r := activity_results(stack, act["id"], ("events", "segments"))) >= 2 and r,
                         WAIT_S, "the webhook's activity and segments ingested")
    assert isinstance(results, list)  # wait_until returns the predicate's truthy value: the results
    elapsed = time.monotonic() - pushed_at
    events = [e for r in results for e in r.data.get("events", [])]
    activities = [e["activity"] for e in events if "activity" in e]
    assert len(activities) == 1 and len(activities[0].get("attachments", [])) == 1  # the photo
    assert sum("segment" in e for e in events) == 2 and sum("segmentEffort" in e for e in events) == 2
    event = stack.strava.push.pushed[-1].event
    assert stack.strava.push.pushed[-1].status == 200
    subscription = stack.strava.push.subscription(acct.client_id)
    assert subscription is not None and event["subscription_id"] == subscription.id
    expected_job = f"webhook:{PROVIDER}:{stack.pool}:{owner}:{act['id']}:c{event['event_time']}"
    assert sorted(r.msg_id for r in results) == [f"result:{expected_job}:d1", f"result:{expected_job}:d1:seg"]
    assert stack.core.account(acct.account_id).subscription_id == str(subscription.id)  # core self-heals the mapping
    budgets = stack.core.rate_limits()
    assert any(k.endswith(".webhook") and v["used"] >= 1 for k, v in budgets.items()), budgets
    print(f"webhook → ingest: {elapsed * 1000:.0f} ms")


def test_an_update_refetches_and_a_burst_of_updates_coalesces_to_one_fetch(
        stack: CairnStack, subscribed: int) -> None:
    acct = webhook_athlete(stack, 2)
    owner = int(acct.external_id)
    first, second = sorted(stack.strava.athlete(owner).activities)
    # A title-only change in the current bucket: held until the bucket closes, then one fetch.
    stack.strava.update_activity(owner, first, title="Morning loop (renamed)")
    results = wait_until(lambda: activity_results(stack, first), WAIT_S, "the update's re-fetch")
    assert ":u" in results[0].msg_id
    # A burst: three updates inside one bucket (the stepping clock lets all three reach the pool).
    base = int(time.time() // COALESCE_S * COALESCE_S - 10 * COALESCE_S)  # a bucket already closed
    for i, fields in enumerate(({"title": "a"}, {"private": "true"}, {"type": "Run"})):
        stack.strava.update_activity(owner, second, event_time=base + i % 2, **fields)
    assert [p.status for p in stack.strava.push.pushed[-3:]] == [200, 200, 200]
    wait_until(lambda: activity_results(stack, second), WAIT_S, "the burst's fetch")
    wait_until(lambda: drained(stack), WAIT_S, "every webhook and fetch decided")
    assert len(activity_results(stack, second)) == 1
    assert detail_calls(stack, second) == 1


def test_delete_is_fetched_and_reaches_core_as_a_not_found_envelope(stack: CairnStack, subscribed: int) -> None:
    """Contract 0.7 has no deletion subject (the published worker's ``cairn.events.source.deleted_upstream``
    is outside core's template): the pool fetches the deleted activity on its own job subject, and
    core receives the §6 envelope, ``not_found``, naming the account and the activity."""
    acct = webhook_athlete(stack, 1)
    owner = int(acct.external_id)
    (aid,) = list(stack.strava.athlete(owner).activities)
    stack.strava.remove_activity(owner, aid)
    envelope = wait_until(lambda: _not_found(stack, aid), WAIT_S, "the deletion's not_found envelope")
    assert envelope.data["failedRef"] == {"userId": acct.user_id, "provider": PROVIDER,
                                          "externalAccountId": acct.account_id, "externalId": str(aid)}
    assert envelope.subject == subjects.result_subject(subjects.FETCH_SOURCE, PROVIDER, stack.pool)
    wait_until(lambda: drained(stack), WAIT_S, "the delete decided")
    assert detail_calls(stack, aid) == 1  # the one fetch that tells core


def _not_found(stack: CairnStack, ext_id: int) -> IngestedResult | None:
    return next((r for r in stack.core.ingested if r.kind == "failure" and r.data["error"]["code"] == "not_found"
                 and r.data.get("failedRef", {}).get("externalId") == str(ext_id)), None)


def test_deauthorization_tells_core_the_account_needs_reauth(stack: CairnStack, subscribed: int) -> None:
    acct = webhook_athlete(stack, 0)
    stack.strava.deauthorize(int(acct.external_id))
    wait_until(lambda: any(e.get("account_id") == acct.account_id for e in stack.core.reauth_events),
               WAIT_S, "core's needs_reauth event")
    event = next(e for e in stack.core.reauth_events if e.get("account_id") == acct.account_id)
    assert event["reason"] == "deauthorized"


@pytest.mark.parametrize("case", ["unknown_owner", "suspended", "lookup_timeout"])
def test_events_that_resolve_to_no_account_are_acked_and_dropped(
        stack: CairnStack, subscribed: int, case: str) -> None:
    if case == "unknown_owner":
        owner = 90_000 + int(uuid.uuid4().int % 9999)
        app, secret = f"app-{owner}", "s-" + uuid.uuid4().hex
        stack.strava.add_app(app, secret)
        stack.strava.add_athlete(owner, n_activities=0, with_gear=False, client_id=app)
        subscribe(stack, app, secret)
        expected = "not_found"
    else:
        acct = webhook_athlete(stack, 0)
        owner = int(acct.external_id)
        if case == "suspended":
            stack.core.account(acct.account_id).auto_import = False
            expected = "auto_import_suspended"
        else:
            stack.core.inject_fault("accounts.lookup", drop=True)
            expected = "lookup failed"
    act = stack.strava.create_activity(owner)
    wait_until(lambda: f"owner {owner} dropped: {expected}" in stack.all_logs(), WAIT_S, f"the {case} drop logged")
    wait_until(lambda: drained(stack), WAIT_S, "the event decided")
    assert detail_calls(stack, act["id"]) == 0 and not activity_results(stack, act["id"])
    dropped = [line for line in stack.all_logs().splitlines() if f"owner {owner} dropped" in line]
    assert len(dropped) == 1 and VERIFY_TOKEN not in stack.all_logs()


@pytest.mark.parametrize("data", [b"not json at all", json.dumps({"provider": "x", "body": "%%%"}).encode(),
                                  json.dumps({"provider": "x", "headers": {},
                                              "body": base64.b64encode(b'{"aspect_type": 1}').decode()}).encode()])
def test_an_undecodable_webhook_is_termed_without_an_envelope(stack: CairnStack, data: bytes) -> None:
    """Reference §3.14: undecodable → Term. No §6 envelope: it fails an import-queue item, and a
    webhook event has none, nor a result subject (``cairn.results.webhook_event.*`` is no contract
    subject, and core's template refuses it)."""
    bridge = stack.bridge
    assert bridge is not None
    terms = bridge.log().count("term webhook_event seq")
    publish_raw_webhook(stack, data)
    wait_until(lambda: bridge.log().count("term webhook_event seq") > terms, WAIT_S, "the term")
    wait_until(lambda: drained(stack), WAIT_S, "the event decided")
    consumer = webhook_consumer(stack)
    assert consumer is not None and consumer["num_redelivered"] == 0
    assert not [r for r in stack.core.ingested if wh.KIND in r.subject]
    assert not [r for r in stack.core.rejected if wh.KIND in r.subject]


def test_core_http_caps_bodies_at_one_mib(stack: CairnStack) -> None:
    resp = httpx.post(stack.core.webhook_url(worker_key(stack)), content=b"x" * ((1 << 20) + 1))
    assert resp.status_code == 413
    assert httpx.post(stack.core.webhook_url("bad.key"), content=b"{}").status_code in (400, 404)


# --------------------------------------------------------------------------- presence


def test_presence_says_webhooks_when_the_token_is_set_and_the_consumer_exists(
        stack: CairnStack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider's webhook rules come with the provider (``Provider.webhook_rules()``): each
    context below builds its own, from the environment of that moment."""
    monkeypatch.setenv("CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN", VERIFY_TOKEN)
    with job_context(stack.nats.url, stack.redis_url, stack.strava, stack.pool, fresh_budget=False) as ctx:
        record = presence.write_presence(ctx, "wh-test")
        assert record is not None and record["webhooks"] is True
    with job_context(stack.nats.url, stack.redis_url, stack.strava, "no-such-pool", fresh_budget=False) as ctx:
        assert presence.presence_record(ctx.settings, ctx.provider, "x", webhooks=wh.presence_flag(ctx))[
            "webhooks"] is False  # token set, but no consumer
    monkeypatch.delenv("CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN")
    with job_context(stack.nats.url, stack.redis_url, stack.strava, stack.pool, fresh_budget=False) as ctx:
        assert wh.presence_flag(ctx) is False  # consumer exists, but no token


# --------------------------------------------------------------------------- operator tools


def test_check_cairn_webhooks_passes_on_the_pool_and_fails_without_the_consumer(
        stack: CairnStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:

    monkeypatch.setenv("CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN", VERIFY_TOKEN)
    # rewrite every instance's record now (the worker wrote its first one before the bridge made the consumer)
    with job_context(stack.nats.url, stack.redis_url, stack.strava, stack.pool, fresh_budget=False) as ctx:
        for key in stack.core.presence(stack.pool):
            presence.write_presence(ctx, key.split(".", 1)[1])
    options = CheckOptions(nats_url=stack.nats.url, provider=PROVIDER, worker_name=stack.pool, webhooks=True,
                           verify_token=VERIFY_TOKEN, timeout_s=5.0)
    assert asyncio.run(run_checks(options, out=sys.stdout)) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    for name in ("webhook consumer", "webhook verify", "presence says webhooks"):
        assert f"PASS  {name}" in out
    monkeypatch.delenv("CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN")
    options.verify_token = None  # a wrong token must be refused: the responder checks tokens
    assert asyncio.run(run_checks(options, out=sys.stdout)) == 0
    capsys.readouterr()
    other = CheckOptions(nats_url=stack.nats.url, provider=PROVIDER, worker_name="no-such-pool", webhooks=True,
                         timeout_s=2.0)
    assert asyncio.run(run_checks(other, out=sys.stdout)) == 1
    out = capsys.readouterr().out
    assert "FAIL  webhook consumer" in out and "FAIL  webhook verify" in out and VERIFY_TOKEN not in out


def test_the_cli_subscribes_shows_and_deletes_without_printing_the_secret(
        stack: CairnStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:

    app, secret = "app-cli", "cli-secret-" + uuid.uuid4().hex
    stack.strava.add_app(app, secret)
    monkeypatch.setenv("STRAVA_CLIENT_ID", app)
    monkeypatch.setenv("STRAVA_CLIENT_SECRET", secret)
    monkeypatch.setenv("CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN", VERIFY_TOKEN)
    base = ["strava", "webhook"]
    callback = stack.core.webhook_url(worker_key(stack))
    assert main([*base, "subscribe", "--callback-url", callback, "--base-url", stack.strava.base_url]) == 0
    sub = stack.strava.push.subscription(app)
    assert sub is not None and sub.callback_url == callback
    assert main([*base, "show", "--base-url", stack.strava.base_url]) == 0
    assert main([*base, "subscribe", "--callback-url", callback, "--base-url", stack.strava.base_url]) == 1
    assert main([*base, "delete", "--base-url", stack.strava.base_url]) == 0
    assert stack.strava.push.subscription(app) is None
    monkeypatch.setenv("CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN", "not-the-pools-token")
    assert main([*base, "subscribe", "--callback-url", callback, "--base-url", stack.strava.base_url]) == 1
    out = capsys.readouterr().out
    assert f"id {sub.id}" in out and "already exists" in out and f"deleted subscription {sub.id}" in out
    assert secret not in out and VERIFY_TOKEN not in out


def test_check_names_a_core_whose_webhook_stream_captures_verify(
        tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Published core's CAIRN_WEBHOOKS takes ``cairn.webhooks.>`` (reference §2.1): a verify request
    then gets a JetStream PubAck, which core would relay to Strava. The check says so."""
    nats_svc = services.start_nats(tmp_path_factory.mktemp("faithful-nats"))
    core = DevCairnCore(nats_svc.url, s3_endpoint, bucket=f"faithful-{uuid.uuid4().hex[:6]}",
                        faithful_webhooks=True).start()
    try:
        options = CheckOptions(nats_url=nats_svc.url, provider=PROVIDER, worker_name="faithful", webhooks=True,
                               timeout_s=2.0)
        assert asyncio.run(run_checks(options, out=sys.stdout)) == 1
        out = capsys.readouterr().out
        assert "got a JetStream PubAck" in out
    finally:
        core.stop()
        nats_svc.stop()
