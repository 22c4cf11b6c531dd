"""Cairn end to end: real bridge process, real Celery provider workers, dev core, fake Strava.

The stack is ``tests.cairn_stack.CairnStack`` (real processes everywhere except
the external systems). Its gate in front of the fake Strava's activity endpoint
holds a job mid-flight for as long as a test needs (a slow provider), which is
how C1 and the SIGKILL case are staged. AckWait is 1 s, so "five AckWaits"
takes five seconds.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import nats
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.msg import Msg

from devstack.fakes.cairn_core import DevCairnCore
from devstack.fakes.cairn_core.router import IngestedResult
from devstack.infra import log_budget
from devstack.infra.log_budget import Allow
from tests.kit.cairn_stack import (
    ACK_WAIT_S,
    ATHLETE_BASE,
    LEASE_TTL_S,
    PROVIDER,
    ROOT,
    WAIT_S,
    CairnStack,
    running_stack,
)
from tests.kit.task_events import TaskEvents
from tests.kit.waiting import wait_until

# slow: starts fleet processes (tests/kit/fleet_guard.py); one xdist worker runs the module, whose
# module-scoped stack is then started once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cairn_e2e")]


# H1: what the provocations below make the bridge and the workers log, each by the test that provokes it.
LOG_BUDGET_ALLOW = (
    Allow(r"refusing to start: core release v0\.9\.0 is incompatible", logs=("bridge-refused",),
          reason="a second bridge meets a core whose release this worker may not serve (contract §1)",
          provoked_by="test_incompatible_core_is_refused_and_missing_info_only_warns"),
    Allow(r"core publishes no release \(no cairn_core/info\)", logs=("bridge-no-info", "worker"),
          reason="a second bridge (and a provider worker's presence timer, if it writes meanwhile) meets a core "
                 "that wrote no cairn_core/info: each says so and runs unchecked",
          provoked_by="test_incompatible_core_is_refused_and_missing_info_only_warns"),
    Allow(r"core release v0\.9\.0 is incompatible with this worker's release \S+ .*presence and manifest are "
          r"not written", logs=("worker",),
          reason="while core says v0.9.0 a provider worker's presence timer finds it incompatible and stops "
                 "writing (it writes again once core is compatible)",
          provoked_by="test_incompatible_core_is_refused_and_missing_info_only_warns"),
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    tmp = tmp_path_factory.mktemp("cairn-e2e")
    with running_stack(tmp, redis_url, s3_endpoint) as s:
        yield s
    log_budget.check([tmp], [*log_budget.baseline(), *LOG_BUDGET_ALLOW])  # read after every process stopped


def _failures(core: DevCairnCore) -> list[IngestedResult]:
    return [r for r in core.ingested if r.kind == "failure"]


# --------------------------------------------------------------------------- tests
def test_fetch_source_is_claim_checked_and_stamped(stack: CairnStack) -> None:
    """C3: the stamp on every result, claim-check for events, contract msg-ids."""
    acct = stack.connect_athlete()
    job = stack.fetch_job(acct, stack.first_activity_id(acct))
    stack.core.enqueue_job("fetch_source", job)
    stack.core.router.wait(lambda: bool(stack.results_for(job["job_id"])), WAIT_S, "the activity result")
    (result,) = stack.results_for(job["job_id"])
    assert result.kind == "events" and result.claim_checked
    assert result.msg_id == f"result:{job['job_id']}:d1"
    for r in stack.core.ingested:
        data = r.data
        assert data.get("workerName") == stack.pool
        assert data.get("workerVersion") and data.get("workerPackage")


def test_long_job_is_never_redelivered(stack: CairnStack) -> None:
    """C1: a job held for 5 × AckWait gets in_progress and is delivered exactly once."""
    acct = stack.connect_athlete()
    ext_id = stack.first_activity_id(acct)
    job = stack.fetch_job(acct, ext_id)
    before = stack.consumer("fetch_source")
    stack.hold_at_the_gate(job)
    threading.Timer(5 * ACK_WAIT_S, stack.gate.open).start()  # the provider is slow for 5 AckWaits
    stack.core.router.wait(lambda: bool(stack.results_for(job["job_id"])), WAIT_S, "the slow job's result")
    (result,) = stack.results_for(job["job_id"])
    assert result.msg_id == f"result:{job['job_id']}:d1"
    detail_calls = [r for r in stack.strava.requests if r.path.endswith(f"/activities/{ext_id}")]
    assert len(detail_calls) == 1
    wait_until(lambda: stack.consumer("fetch_source")["num_ack_pending"] == 0, WAIT_S, "the bridge's ack")
    assert stack.consumer("fetch_source")["num_redelivered"] == before["num_redelivered"]  # never redelivered


def test_sigkilled_worker_job_is_redelivered_and_ingested_once(stack: CairnStack) -> None:
    assert stack.bridge is not None
    acct = stack.connect_athlete()
    ext_id = stack.first_activity_id(acct)
    job = stack.fetch_job(acct, ext_id)
    stack.hold_at_the_gate(job)
    victim = stack.workers[-1]
    victim.kill(signal.SIGKILL)
    stack.gate.open()
    stack.start_worker()
    stack.core.router.wait(lambda: bool(stack.results_for(job["job_id"])), WAIT_S + LEASE_TTL_S,
                           "the redelivered job's result")
    results = stack.results_for(job["job_id"])
    assert len(results) == 1, [r.msg_id for r in results]
    assert results[0].msg_id == f"result:{job['job_id']}:d2"
    key = (PROVIDER, acct.account_id, ext_id)
    assert key in stack.core.router.sources
    assert "lease expired" in stack.bridge.log()


_json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                            lambda inner: st.lists(inner, max_size=3)
                            | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
_poison = st.one_of(
    st.binary(min_size=1, max_size=40).filter(lambda b: not b.strip().startswith(b"{")),
    _json_values.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"job_id": st.integers() | st.none(), "ext_id": st.lists(st.integers(), max_size=2)},
                          optional={"account_id": st.text(max_size=5)}).map(lambda v: json.dumps(v).encode()),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_poison)
def test_poison_payloads_get_an_envelope_and_a_term(stack: CairnStack, body: bytes) -> None:
    assert stack.bridge is not None
    seen = len(_failures(stack.core))
    stack.publish_raw("fetch_source", body)
    stack.core.router.wait(lambda: len(_failures(stack.core)) > seen, WAIT_S, "a failure envelope")
    envelope = _failures(stack.core)[-1].data
    assert envelope["error"]["code"] == "bad_payload"
    wait_until(lambda: stack.consumer("fetch_source")["num_ack_pending"] == 0, WAIT_S, "the term")
    assert stack.consumer("fetch_source")["num_pending"] == 0
    assert stack.bridge.proc.poll() is None


def test_fifth_delivery_of_a_failing_job_is_termed_with_an_envelope(stack: CairnStack) -> None:
    """C2: no NAK loop forever."""
    bridge = stack.bridge
    assert bridge is not None
    acct = stack.connect_athlete()
    ext_id = stack.first_activity_id(acct)
    job = stack.fetch_job(acct, ext_id)
    stack.strava.fail("activity", 500, times=20)
    try:
        stack.core.enqueue_job("fetch_source", job)
        stack.core.router.wait(lambda: bool(_envelopes_for(stack, ext_id)), 90.0, "the give-up envelope")
    finally:
        stack.strava._faults.pop("activity", None)  # the fake has no public "clear faults"
    (env,) = _envelopes_for(stack, ext_id)
    assert env.data["error"]["code"] == "max_deliveries"
    assert env.data["failedRef"]["externalAccountId"] == acct.account_id
    assert env.msg_id == f"failed:{PROVIDER}:{ext_id}:d5"
    wait_until(lambda: re.search(r"term fetch_source seq \d+ \(delivery 5\)", bridge.log()), WAIT_S,
               "the term after the envelope")
    assert not stack.results_for(job["job_id"])


def _envelopes_for(stack: CairnStack, ext_id: str) -> list[IngestedResult]:
    return [r for r in _failures(stack.core) if r.data.get("failedRef", {}).get("externalId") == ext_id]


def test_rate_limit_nak_is_anchored_to_the_window_reset(stack: CairnStack) -> None:
    bridge = stack.bridge
    assert bridge is not None
    acct = stack.connect_athlete(own_app=True)  # the spent window must not starve the other tests
    job = stack.fetch_job(acct, stack.first_activity_id(acct))
    offset = len(bridge.log())
    stack.strava.force_429(times=1, window="short")
    stack.core.enqueue_job("fetch_source", job)
    now = datetime.now(UTC)
    reset = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0) + timedelta(minutes=15)
    match = wait_until(lambda: re.search(r"nak fetch_source seq \d+ \(delivery 1\) delay ([\d.]+)s: rate_limited",
                                         bridge.log()[offset:]), WAIT_S, "the rate-limit NAK")
    delay = float(match.group(1))
    expected = (reset - now).total_seconds()
    assert expected - 5 <= delay <= expected + 120, (delay, expected)


def test_presign_failure_naks_and_the_result_is_ingested_later(stack: CairnStack) -> None:
    acct = stack.connect_athlete()
    job = stack.fetch_job(acct, stack.first_activity_id(acct))
    stack.core.inject_fault("presign_upload", {"error": "transient"}, times=1)
    stack.core.enqueue_job("fetch_source", job)
    stack.core.router.wait(lambda: bool(stack.results_for(job["job_id"])), WAIT_S, "the later result")
    (result,) = stack.results_for(job["job_id"])
    assert result.msg_id == f"result:{job['job_id']}:d2"


def test_discover_and_exchange_run_through_the_pool_without_leaking_secrets(stack: CairnStack) -> None:
    acct = stack.connect_athlete(n_activities=5)
    reply = stack.core.discover(acct.account_id)
    assert reply.get("items") and not reply.get("error"), reply

    athlete_id = ATHLETE_BASE + 900
    stack.strava.add_athlete(athlete_id, n_activities=1, with_gear=False)
    code = stack.strava.issue_code(athlete_id)
    linked = stack.core.oauth_exchange(PROVIDER, stack.pool, code, stack.strava.client_id,
                                       stack.strava.client_secret, "http://127.0.0.1/auth/oauth/strava/callback")
    assert linked.external_id == str(athlete_id) and linked.access_token
    secrets = [stack.strava.client_secret, code, linked.access_token, linked.refresh_token or "unused"]

    r = redis.Redis.from_url(stack.redis_url)
    # a client without decode_responses returns bytes; redis types its replies as bytes | str
    stored = b"".join(cast("bytes | None", r.get(k)) or b"" for k in r.scan_iter("celery-task-meta-*"))
    queued = b"".join(b"".join(cast("list[bytes]", r.lrange(k, 0, -1))) for k in r.scan_iter("*")
                      if r.type(k) == b"list")
    logs = stack.all_logs()
    for secret in secrets:
        assert secret.encode() not in stored, "a secret reached the result backend"
        assert secret.encode() not in queued, "a secret sits in a task message"
        assert secret not in logs, "a secret reached a log"
    assert not list(r.scan_iter("cairn:sealed:*")), "a parked secret outlived its exchange"


def test_cairn_side_holds_no_s3_credentials(stack: CairnStack) -> None:
    """S2: every blob goes through presigned URLs; no process of the pool has AWS_* variables."""
    assert stack.bridge is not None
    pids = [stack.bridge.proc.pid] + [w.proc.pid for w in stack.workers if w.proc.poll() is None]
    for pid in pids:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert not [e for e in environ if e.startswith(b"AWS_")], pid


def test_presence_and_manifest_are_written_by_the_pool(stack: CairnStack) -> None:
    """Every live instance writes its own record: at start, and when asked (``cairn_presence``)."""
    live = [w for w in stack.workers if w.proc.poll() is None]
    keys = {f"{stack.pool}.{w.name.replace('@', '-')}" for w in live}
    records = wait_until(lambda: keys <= set(stack.core.live_presence(stack.pool)) and
                         stack.core.live_presence(stack.pool), WAIT_S, "start-up presence of every instance")
    assert isinstance(records, dict)
    first_seen = {k: records[k]["last_seen"] for k in keys}
    # One broadcast of the control command, answered by each instance.
    subprocess.run([sys.executable, "-c", "from tasks.presence import broadcast_presence; broadcast_presence()"],
                   cwd=ROOT, env=stack.env, check=True, timeout=60)
    wait_until(lambda: all(stack.core.presence(stack.pool)[k]["last_seen"] > first_seen[k] for k in keys),
               WAIT_S, "a fresh record from every instance after the broadcast")
    record = stack.core.presence(stack.pool)[next(iter(keys))]
    for key in ("worker_name", "worker_key", "instance_id", "version", "release", "provider", "package",
                "webhooks", "last_seen"):
        assert key in record
    assert record["capabilities"]  # Strava declares Activity, Lap, Gear
    assert record["worker_key"] == f"{stack.pool}-{PROVIDER}"
    assert stack.core.manifests()[stack.pool]["capabilities"] == record["capabilities"]  # one source


def test_core_schedules_import_gear_because_the_pools_manifest_declares_gear(stack: CairnStack) -> None:
    """Contract §3/§4: import_gear only for a live pool whose *manifest* declares Gear."""
    acct = stack.connect_athlete(n_activities=0)
    manifest = wait_until(lambda: stack.core.manifests().get(stack.pool), WAIT_S, "the pool's manifest")
    wait_until(lambda: stack.core.live_presence(stack.pool), WAIT_S, "a live worker of the pool")
    assert "Gear" in manifest["capabilities"]
    bare = {k: v for k, v in manifest.items() if k != "capabilities"}
    stack.core.kv_put("cairn_worker_manifests", stack.pool, bare)  # live presence still declares Gear
    kinds = [j.subject.split(".")[2] for j in stack.core.schedule_reconcile(acct.account_id, force=True)]
    assert kinds == ["reconcile"]
    # The pool rewrites its manifest (what each instance's timer does every 10 min; the control command
    # asks for it now) and core now sends gear.
    subprocess.run([sys.executable, "-c", "from tasks.presence import broadcast_presence; broadcast_presence()"],
                   cwd=ROOT, env=stack.env, check=True, timeout=60)
    wait_until(lambda: "Gear" in (stack.core.manifests()[stack.pool].get("capabilities") or {}), WAIT_S,
               "the pool's own manifest again")
    gear = [j for j in stack.core.schedule_reconcile(acct.account_id, force=True) if "import_gear" in j.subject]
    assert len(gear) == 1 and not gear[0].duplicate
    job_id = gear[0].payload["job_id"]
    stack.core.router.wait(lambda: bool(stack.results_for(job_id)), WAIT_S, "the pool's import_gear result")
    (result,) = stack.results_for(job_id)
    assert result.msg_id == f"result:{job_id}" and result.data["workerName"] == stack.pool


def test_incompatible_core_is_refused_and_missing_info_only_warns(stack: CairnStack) -> None:
    stack.core.set_release("v0.9.0")
    try:
        refused = stack.spawn_bridge("bridge-refused")
        assert refused.proc.wait(WAIT_S) != 0
        assert "incompatible" in refused.log()
    finally:
        stack.core.set_release("v0.7.0")

    async def drop_info() -> None:
        nc = await nats.connect(stack.nats.url)
        try:
            await (await nc.jetstream().key_value("cairn_core")).delete("info")
        finally:
            await nc.close()
    asyncio.run(drop_info())
    try:
        second = stack.spawn_bridge("bridge-no-info")
        wait_until(lambda: "cairn bridge started" in second.log() or second.proc.poll() is not None,
                   WAIT_S, "the second bridge")
        assert second.proc.poll() is None, second.log()[-2000:]
        assert "no release" in second.log() or "publishes no release" in second.log()
        assert second.stop() == 0
    finally:
        stack.core.set_release("v0.7.0")


def test_reconcile_result_and_sub_job_msg_ids_follow_the_contract(stack: CairnStack) -> None:
    """C3 for reconcile: ``result:<job_id>`` on the account-suffixed subject, sub-jobs
    ``reconcile:<provider>:<account_id>:<ext_id>`` (sniffed on core NATS as they are published)."""
    acct = stack.connect_athlete(n_activities=3)
    seen: list[tuple[str, str]] = []
    ready, done = threading.Event(), threading.Event()

    async def sniff() -> None:
        nc = await nats.connect(stack.nats.url)

        async def record(msg: Msg) -> None:
            seen.append(((msg.headers or {}).get("Nats-Msg-Id", ""), str(json.loads(msg.data).get("ext_id"))))

        await nc.subscribe(f"cairn.jobs.fetch_source.{PROVIDER}.{stack.pool}", cb=record)
        await nc.flush()
        ready.set()
        while not done.is_set():
            await asyncio.sleep(0.05)
        await nc.close()

    sniffer = threading.Thread(target=asyncio.run, args=(sniff(),), daemon=True)
    sniffer.start()
    assert ready.wait(WAIT_S)
    try:
        job_id = f"rec-{uuid.uuid4().hex[:8]}"
        stack.core.enqueue_job("reconcile", {"job_id": job_id, "account_id": acct.account_id,
                                             "user_id": acct.user_id, "provider": PROVIDER,
                                             "max_enqueue": 2, "known_ext_ids": []})
        stack.core.router.wait(lambda: any(r.kind == "reconcile" and r.account_id == acct.account_id
                                           for r in stack.core.ingested), WAIT_S, "the reconcile result")
        wait_until(lambda: len(seen) >= 2, WAIT_S, "two fetch_source sub-jobs")
    finally:
        done.set()
        sniffer.join(5)
    rec = next(r for r in stack.core.ingested if r.kind == "reconcile" and r.account_id == acct.account_id)
    assert rec.subject == f"cairn.results.reconcile.{PROVIDER}.{acct.account_id}"
    assert rec.msg_id == f"result:{job_id}"
    assert rec.data["workerName"] == stack.pool and rec.data["workerPackage"] and rec.data["workerVersion"]
    for msg_id, ext_id in seen:
        assert msg_id == f"reconcile:{PROVIDER}:{acct.account_id}:{ext_id}"


def test_exchange_secrets_never_reach_task_events(stack: CairnStack) -> None:
    """S1 as Flower would show it: args of every sent/received task and every result."""
    athlete_id = ATHLETE_BASE + 901
    stack.strava.add_athlete(athlete_id, n_activities=1, with_gear=False)
    code = stack.strava.issue_code(athlete_id)
    with TaskEvents(stack.redis_url) as events:
        linked = stack.core.oauth_exchange(PROVIDER, stack.pool, code, stack.strava.client_id,
                                           stack.strava.client_secret,
                                           "http://127.0.0.1/auth/oauth/strava/callback")
        wait_until(lambda: any(e.get("type") == "task-succeeded" for e in events.events), WAIT_S,
                   "the exchange task's events")
    names = {e.get("name") for e in events.events if e.get("type") in ("task-sent", "task-received")}
    assert "cairn.exchange" in names, names
    text = events.text()
    assert linked.access_token is not None
    for secret in (stack.strava.client_secret, code, linked.access_token, linked.refresh_token or "unused"):
        assert secret not in text


def test_parse_blob_our_parser_cannot_read_is_naked_for_a_newer_instance(stack: CairnStack) -> None:
    bridge = stack.bridge
    assert bridge is not None
    acct = stack.connect_athlete()
    offset = len(bridge.log())
    job = stack.fetch_job(acct, stack.first_activity_id(acct))
    job |= {"blob": {"url": "http://127.0.0.1:1/never-fetched", "fallback_handle": "users/x/strava/raw.json"},
            "min_parser_version": "99.0"}  # another dataset
    stack.core.enqueue_job("parse_blob", job)
    wait_until(lambda: re.search(r"nak parse_blob seq \d+ \(delivery 1\) delay [\d.]+s: dataset 99",
                                 bridge.log()[offset:]), WAIT_S, "the parser-version NAK")
    assert not stack.results_for(job["job_id"])
    assert not [r for r in _failures(stack.core) if r.data.get("failedRef", {}).get("externalId") == job["ext_id"]]


def test_flower_shows_the_job_but_not_its_lease_token(stack: CairnStack) -> None:
    """cairn.job carries the lease token the bridge granted; task events show it masked."""
    acct = stack.connect_athlete(n_activities=1)
    job = stack.fetch_job(acct, stack.first_activity_id(acct))
    r = redis.Redis.from_url(stack.redis_url)
    with TaskEvents(stack.redis_url) as events:
        stack.core.enqueue_job("fetch_source", job)
        wait_until(lambda: any(e.get("type") == "task-received" and job["job_id"] in str(e.get("args"))
                               for e in events.events), WAIT_S, "the job's task-received event")
        # the token the bridge granted for this message, read while the task holds its lease
        tokens = {v.decode().split(":")[1] for k in r.scan_iter("sy:lease:cairn:*")
                  if (v := cast("bytes | None", r.get(k)))}  # bytes: a client without decode_responses
        stack.core.router.wait(lambda: bool(stack.results_for(job["job_id"])), WAIT_S, "the job's result")
    shown = [str(e.get("args")) for e in events.events
             if e.get("type") in ("task-sent", "task-received") and job["job_id"] in str(e.get("args"))]
    assert shown and all("'lease_token': '…'" in a and "fetch_source" in a for a in shown), shown
    assert all(t not in events.text() for t in tokens)
