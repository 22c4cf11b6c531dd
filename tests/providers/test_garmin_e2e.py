"""The Garmin pool end to end: real bridge and Celery worker, the dev core, the fake Garmin Connect.

Every job goes the production way: core publishes on the pool's subject, the
bridge admits and dispatches it, the provider task fetches the connection's
login from ``cairn.creds.garmin.get``, garth logs in through the fake's proxy
(TLS, signed OAuth1, OAuth2 bearer), and core ingests what the pool publishes.
Failures are Garmin's own answers: a wrong password, two-step verification, a
locked account, a corrupt original, 429 and 5xx.

The pool runs under core's standard NATS permission template (the stack kit's
``nats_auth``): after every test the server's log must hold no ``Permissions
Violation``, so every Garmin job kind, the discover responder and every
``cairn.creds.garmin.get`` stayed within it.
"""

from __future__ import annotations

import io
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf import json_format

from devstack.fakes.cairn_core import DevCairnCore, IngestedResult
from devstack.infra import cairn_stack
from tests.kit import fit_forms
from tests.kit.cairn_stack import ROOT, WAIT_S
from tests.kit.garmin_stack import GARMIN, GARMIN_PACKAGE, GarminStack
from tests.kit.waiting import wait_until
from workers.providers.kinds import FETCH_SOURCE, PARSE_BLOB, RECONCILE

# slow: starts fleet processes (tests/kit/fleet_guard.py); one xdist worker runs the module, whose
# module-scoped stack is then started once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("garmin_e2e")]

CHECK_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_endpoint: str) -> Iterator[GarminStack]:
    s = GarminStack(tmp_path_factory.mktemp("garmin-e2e"), redis_url, s3_endpoint)
    try:
        s.start()
        s.start_worker(concurrency=1)  # one process: its in-memory session cache is the one that counts
        s.start_bridge()
        yield s
    finally:
        s.stop()


@pytest.fixture(autouse=True)
def within_the_template(stack: GarminStack) -> Iterator[None]:
    """Each test's jobs, responders and creds requests stayed within core's template for the pool."""
    yield
    assert stack.nats_auth.violations() == []
    mine = {c.get("authorized_user") for c in stack.nats_auth.connections() if c.get("name") == stack.pool}
    assert mine == {stack.nats_auth.login(stack.pool_ref).user}, mine  # the pool logged in as itself


def _job(acct: cairn_stack.Connected, ext_id: str | int) -> dict[str, Any]:
    return cairn_stack.CairnStack.fetch_job(acct, str(ext_id))


def _result(core: DevCairnCore, msg_id: str) -> IngestedResult:
    core.router.wait(lambda: any(r.msg_id == msg_id for r in core.ingested), WAIT_S, f"result {msg_id}")
    return next(r for r in core.ingested if r.msg_id == msg_id)


def _failure(core: DevCairnCore, ext_id: str | int) -> dict[str, Any]:
    def found() -> list[IngestedResult]:
        return [r for r in core.ingested if r.kind == "failure"
                and r.data.get("failedRef", {}).get("externalId") == str(ext_id)]
    core.router.wait(lambda: bool(found()), WAIT_S, f"a failure envelope for {ext_id}")
    return found()[0].data


def test_fetch_source_imports_the_fit_activity_archived_and_claim_checked(stack: GarminStack) -> None:
    core, garmin = stack.core, stack.garmin
    assert core is not None and garmin is not None
    acct, account = stack.connect_garmin(n_activities=2)
    first, second = (a.activity_id for a in account.newest_first())
    creds_before = sum(1 for name, _ in core.responders.calls if name == "creds.get")
    job = _job(acct, first)
    core.enqueue_job(FETCH_SOURCE, job)
    rec = _result(core, f"result:{job['job_id']}:d1")
    assert rec.kind == "events" and rec.claim_checked and rec.provider == GARMIN and rec.pool == stack.pool
    data = rec.data
    assert (data["workerName"], data["workerVersion"], data["workerPackage"]) == (stack.pool, "1.0", GARMIN_PACKAGE)
    gear, activity = data["events"]
    assert gear["type"] == "WORKER_EVENT_TYPE_GEAR" and gear["gear"]["payload"]["kind"] == "shoes"
    imported = activity["activity"]
    payload = imported["payload"]
    assert (payload["type"], payload["discipline"]) == ("ACTIVITY_TYPE_RUN", "DISCIPLINE_RUN_TRAIL")
    assert payload["timezone"] == "Europe/Zurich" and payload["title"].startswith("Fake trail_running")
    assert payload["gearExternalId"] == gear["gear"]["ref"]["externalId"]
    assert payload["extra"]["device"] == "garmin fr955" and len(payload["laps"]) == 2
    assert imported["stream"]["sampleCount"] == 121 and "heartRateBpm" in imported["stream"]
    # The raw inputs were archived first (dataset 1, a zip holding the original FIT), through presign.
    assert imported["rawContentType"] == "application/zip"
    stored = core.blobs.get(imported["rawBlobId"])
    assert stored is not None and imported["rawBlobId"].startswith(f"users/{acct.user_id}/{GARMIN}/")
    assert set(zipfile.ZipFile(io.BytesIO(stored)).namelist()) == {"archive.json", "activity.fit"}

    # A second job: credentials fetched again from core, the garth session reused (no second login).
    job2 = _job(acct, second)
    core.enqueue_job(FETCH_SOURCE, job2)
    _result(core, f"result:{job2['job_id']}:d1")
    assert sum(1 for name, _ in core.responders.calls if name == "creds.get") - creds_before == 2
    assert garmin.logins(account.email) == 1
    assert garmin.calls("download", account.email) == 2


def test_parse_blob_reproduces_the_import_byte_for_byte(stack: GarminStack) -> None:
    core = stack.core
    assert core is not None
    acct, account = stack.connect_garmin(n_activities=1)
    job = _job(acct, account.newest_first()[0].activity_id)
    core.enqueue_job(FETCH_SOURCE, job)
    imported = _result(core, f"result:{job['job_id']}:d1")
    blob_id = imported.data["events"][-1]["activity"]["rawBlobId"]
    reparse = dict(_job(acct, job["ext_id"]), job_id=f"reparse-{uuid.uuid4().hex[:8]}",
                   blob={"url": core.blobs.presign_download(blob_id)["url"], "fallback_handle": blob_id},
                   min_parser_version="1.0")
    downloads = stack.garmin.calls("download") if stack.garmin else 0
    core.enqueue_job(PARSE_BLOB, reparse)
    reparsed = _result(core, f"result:{reparse['job_id']}:d1")
    assert reparsed.job_type == "parse_blob" and reparsed.claim_checked
    assert (json_format.MessageToJson(reparsed.result, sort_keys=True).replace("parse_blob", "")
            == json_format.MessageToJson(imported.result, sort_keys=True).replace("parse_blob", ""))
    assert list(reparsed.result.events) == list(imported.result.events)  # the same messages, field for field
    assert stack.garmin is not None and stack.garmin.calls("download") == downloads  # no Garmin call


def test_reconcile_enqueues_unknown_activities_and_always_publishes(stack: GarminStack) -> None:
    core = stack.core
    assert core is not None
    acct, account = stack.connect_garmin(n_activities=3)
    known, *new = [str(a.activity_id) for a in account.newest_first()]
    job = {"job_id": f"rec-{uuid.uuid4().hex[:8]}", "account_id": acct.account_id, "user_id": acct.user_id,
           "provider": GARMIN, "max_enqueue": 500, "known_ext_ids": [known]}
    core.enqueue_job(RECONCILE, job)
    rec = _result(core, f"result:{job['job_id']}")
    assert rec.kind == "reconcile" and rec.subject == f"cairn.results.reconcile.{GARMIN}.{acct.account_id}"
    assert rec.data["newWatermark"]
    for ext_id in new:  # the sub-jobs ran on this pool (deterministic ids) and were imported
        _result(core, f"result:{job['job_id']}:{ext_id}:d1")
    again = dict(job, job_id=f"rec-{uuid.uuid4().hex[:8]}", known_ext_ids=[known, *new])
    core.enqueue_job(RECONCILE, again)
    assert _result(core, f"result:{again['job_id']}").kind == "reconcile"  # nothing new, still published


def test_discover_lists_the_accounts_activities(stack: GarminStack) -> None:
    acct, account = stack.connect_garmin(n_activities=3)
    reply = stack.core.discover(acct.account_id)
    assert reply["complete"] is True
    assert [i["external_id"] for i in reply["items"]] == [str(a.activity_id) for a in account.newest_first()]


def test_a_wrong_password_is_needs_reauth_with_an_envelope_and_no_retry(stack: GarminStack) -> None:
    core, garmin = stack.core, stack.garmin
    assert core is not None and garmin is not None
    acct, account = stack.connect_garmin(n_activities=1, password="not-the-password")
    ext_id = account.newest_first()[0].activity_id
    core.enqueue_job(FETCH_SOURCE, _job(acct, ext_id))
    envelope = _failure(core, ext_id)
    assert envelope["error"]["code"] == "needs_reauth" and envelope["error"]["class"] == "ERROR_CLASS_AUTH_EXPIRED"
    wait_until(lambda: core.account(acct.account_id).status == "needs_reauth", WAIT_S, "core's needs_reauth")
    core.enqueue_job(RECONCILE, {"job_id": f"rec-{uuid.uuid4().hex[:8]}", "account_id": acct.account_id,
                                   "user_id": acct.user_id, "provider": GARMIN})
    wait_until(lambda: sum(1 for r in core.ingested if r.kind == "failure"
                           and r.data.get("failedRef", {}).get("externalAccountId") == acct.account_id) >= 2,
               WAIT_S, "the next job's envelope")
    assert garmin.logins(account.email) == 1  # refused once; never tried again
    assert "not-the-password" not in stack.all_logs()


@pytest.mark.parametrize(("kind", "code"), [("mfa", "mfa_required"), ("locked", "account_locked")])
def test_mfa_and_locked_accounts_fail_clearly(stack: GarminStack, kind: str, code: str) -> None:
    core = stack.core
    assert core is not None
    acct, account = stack.connect_garmin(n_activities=1, mfa=kind == "mfa", locked=kind == "locked")
    ext_id = account.newest_first()[0].activity_id
    core.enqueue_job(FETCH_SOURCE, _job(acct, ext_id))
    envelope = _failure(core, ext_id)
    assert (envelope["error"]["code"], envelope["error"]["class"]) == (code, "ERROR_CLASS_AUTH_INVALID")
    assert core.account(acct.account_id).status == "active"  # the login is right: no re-connect asked


def test_a_corrupt_original_ends_in_an_envelope(stack: GarminStack) -> None:
    core, garmin = stack.core, stack.garmin
    assert core is not None and garmin is not None
    acct, account = stack.connect_garmin(n_activities=1)
    activity = account.newest_first()[0]
    garmin.set_original(account.email, activity.activity_id, b"\x0e\x10" + b"\x00" * 40)  # a truncated FIT
    core.enqueue_job(FETCH_SOURCE, _job(acct, activity.activity_id))
    assert _failure(core, activity.activity_id)["error"]["code"] == "corrupt_fit"


def test_an_original_with_compressed_timestamps_imports(stack: GarminStack) -> None:
    """A device that writes compressed-timestamp record headers (tests/kit/fit_forms.py): imported, not corrupt."""
    core, garmin = stack.core, stack.garmin
    assert core is not None and garmin is not None
    acct, account = stack.connect_garmin(n_activities=1)
    activity = account.newest_first()[0]
    garmin.set_original(account.email, activity.activity_id, fit_forms.activity(compressed=True))
    job = _job(acct, activity.activity_id)
    core.enqueue_job(FETCH_SOURCE, job)
    imported = _result(core, f"result:{job['job_id']}:d1").data["events"][-1]["activity"]
    assert imported["payload"]["startTime"] == fit_forms.START.isoformat().replace("+00:00", "Z")
    assert len(imported["payload"]["laps"]) == 2
    assert imported["stream"]["sampleCount"] == fit_forms.LEG_S // fit_forms.STEP_S + 1


@pytest.mark.parametrize(("endpoint", "status"), [("download", 429), ("activity", 503)])
def test_429_and_5xx_nak_with_delay_and_the_redelivery_imports(stack: GarminStack, endpoint: str,
                                                                status: int) -> None:
    core, garmin = stack.core, stack.garmin
    assert core is not None and garmin is not None
    acct, account = stack.connect_garmin(n_activities=1)
    garmin.fail(endpoint, status, retry_after_s=1 if status == 429 else None)
    job = _job(acct, account.newest_first()[0].activity_id)
    core.enqueue_job(FETCH_SOURCE, job)
    # The first delivery is NAKed and a redelivery imports: usually the second, but a redelivery that
    # reuses a pooled tunnel the fake's server has just closed on its 5 s keep-alive is NAKed as
    # transient too (a ProxyError through the loopback proxy), and the third imports.
    prefix = f"result:{job['job_id']}:d"
    core.router.wait(lambda: any(r.msg_id is not None and r.msg_id.startswith(prefix) for r in core.ingested),
                     WAIT_S, f"a {prefix}* result")
    assert not [r for r in core.ingested if r.msg_id == f"{prefix}1"]
    reason = "rate_limited" if status == 429 else "transient"
    assert any("nak fetch_source" in line and reason in line for line in stack.all_logs().splitlines())


def _check(stack: GarminStack, *extra: str) -> subprocess.CompletedProcess[str]:
    """``switchyard check cairn`` as core's operators run it: its own process, core's NATS login (the
    environment holds the pool's)."""
    core = stack.nats_auth.core
    return subprocess.run([sys.executable, "-m", "ops", "check", "cairn", "--nats", stack.nats.url,
                           "--user", core.user, f"--password={core.password}",  # a password may begin with "-"
                           "--provider", GARMIN, "--worker-name", stack.pool, "--timeout", "15", *extra],
                          cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)


@pytest.mark.parametrize("with_user", [True, False], ids=["active", "active-without-user-id"])
def test_the_conformance_check_passes_against_the_garmin_pool(stack: GarminStack, with_user: bool) -> None:
    """The suite the Strava pool passes (tests/ops/test_cairn_check.py), against the Garmin pool; without
    ``--user-id`` (the Go harness's own reconcile body) the pool answers without listing anyone."""
    core = stack.core
    wait_until(lambda: core.live_presence(stack.pool), WAIT_S, "the pool's presence")
    acct, account = stack.connect_garmin(n_activities=1)
    out = _check(stack, "--active", "--account-id", acct.account_id,
                 *(("--user-id", acct.user_id) if with_user else ()))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for name in ("presence heartbeat", f"consumer for cairn.jobs.fetch_source.{GARMIN}.{stack.pool}",
                 f"consumer for cairn.jobs.reconcile.{GARMIN}.{stack.pool}",
                 f"consumer for cairn.jobs.parse_blob.{GARMIN}.{stack.pool}",
                 "discover request/reply", "reconcile round-trip"):
        assert f"PASS  {name}" in lines, out.stdout
    assert lines[-1] == "worker is contract-compliant"
    if not with_user:
        assert stack.garmin is not None and stack.garmin.logins(account.email) == 0  # nothing listed
    manifest = stack.core.manifests()[stack.pool]
    meta = manifest["provider_meta"]
    assert meta["auth_method"] == "credentials" and "oauth" not in meta
    assert [f["key"] for f in meta["config_fields"]] == ["client_id", "client_secret"]
    assert meta["activity_url_template"] == "https://connect.garmin.com/modern/activity/{id}"
