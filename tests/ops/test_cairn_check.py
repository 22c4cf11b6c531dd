"""``switchyard check cairn`` against our real pool, and against a pool missing a consumer.

The pool is real (bridge process + Celery provider worker, see
``tests.cairn_stack.CairnStack``); the checker runs as its own process, exactly as
an operator or CI would run it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import nats
import pytest

from tests.kit.cairn_stack import PROVIDER, ROOT, WAIT_S, CairnStack, running_stack
from tests.kit.waiting import wait_until

# slow: starts fleet processes (tests/kit/fleet_guard.py); one xdist worker runs the module, whose
# module-scoped stack is then started once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cairn_check")]

CHECK_TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    with running_stack(tmp_path_factory.mktemp("cairn-check"), redis_url, s3_endpoint) as s:
        core = s.core
        wait_until(lambda: core.live_presence(s.pool), WAIT_S, "the pool's presence")
        yield s


def run_check(stack: CairnStack, *extra: str, worker_name: str | None = None) -> subprocess.CompletedProcess[str]:
    """As core's operators run the harness: core's NATS login, not the pool's (its env holds the pool's)."""
    core = stack.nats_auth.core
    cmd = [sys.executable, "-m", "ops", "check", "cairn", "--nats", stack.nats.url,
           "--user", core.user, f"--password={core.password}",  # a password may begin with "-"
           "--provider", PROVIDER, "--worker-name", worker_name or stack.pool, "--timeout", "15", *extra]
    return subprocess.run(cmd, cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=120)


def test_check_passes_against_our_pool(stack: CairnStack) -> None:
    acct = stack.connect_athlete()
    out = run_check(stack, "--active", "--account-id", acct.account_id, "--user-id", acct.user_id)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for name in ("presence heartbeat", f"consumer for cairn.jobs.fetch_source.{PROVIDER}.{stack.pool}",
                 f"consumer for cairn.jobs.reconcile.{PROVIDER}.{stack.pool}",
                 f"consumer for cairn.jobs.parse_blob.{PROVIDER}.{stack.pool}",
                 "discover request/reply", "reconcile round-trip"):
        assert f"PASS  {name}" in lines, out.stdout
    assert lines[-1] == "worker is contract-compliant"


def test_check_active_without_user_id_passes(stack: CairnStack) -> None:
    """The harness's own reconcile body has no user_id (reference §5): our pool answers it, stamped,
    instead of terming it bad_payload; no sub-job is enqueued without an owner."""
    acct = stack.connect_athlete()
    out = run_check(stack, "--active", "--account-id", acct.account_id)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS  reconcile round-trip" in out.stdout.splitlines()
    # The manifest declares Gear, so the checker requires (and finds) the import_gear consumer.
    assert f"PASS  consumer for cairn.jobs.import_gear.{PROVIDER}.{stack.pool}" in out.stdout.splitlines()
    core = stack.core
    mine = lambda: [r for r in core.ingested if r.subject.endswith(acct.account_id)]  # noqa: E731
    core.router.wait(lambda: bool(mine()), WAIT_S, "core's copy of the reconcile result")
    [rec] = mine()
    assert rec.kind == "reconcile" and rec.msg_id is not None
    assert rec.msg_id.startswith("result:conformance-")  # not a failure
    assert not [r for r in stack.strava.requests if r.athlete_id == int(acct.external_id)]  # nothing listed


def test_check_fails_for_an_unknown_pool(stack: CairnStack) -> None:
    out = run_check(stack, worker_name="nobody-here")
    assert out.returncode == 1, out.stdout
    assert any(line.startswith("FAIL  presence heartbeat") for line in out.stdout.splitlines())
    assert any(line.startswith("FAIL  discover request/reply") for line in out.stdout.splitlines())


def test_check_fails_when_a_required_consumer_is_missing(stack: CairnStack) -> None:
    """Run last: it deletes the pool's reconcile consumer (the §3 incident class)."""
    subject = f"cairn.jobs.reconcile.{PROVIDER}.{stack.pool}"
    durable = stack.consumer("reconcile")["name"]
    url = stack.nats.url

    async def delete() -> None:
        nc = await nats.connect(url)
        try:
            await nc.jetstream().delete_consumer("CAIRN_JOBS", durable)
        finally:
            await nc.close()
    asyncio.run(delete())
    out = run_check(stack)
    assert out.returncode == 1, out.stdout
    fail = [line for line in out.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fail) == 1 and subject in fail[0] and "accumulate" in fail[0], out.stdout
    assert "1 violation(s)" in out.stdout
