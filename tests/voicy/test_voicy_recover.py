"""``pipeline.recover``, the one recovery rule, at the pipeline level: real Redis, dev Voicy API, local store.

Media in the store → the job is returned for a transcription (pending grant,
on the gpu set); no media → a retryable ``failure`` and the job forgotten. The
reaper and the bridge's claim-ready path both go through it; the end-to-end
runs of both are in test_voicy_e2e (claim-ready after a restart) and
test_voicy_grants (the reaper).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit.voicy_stack import (
    claim_without_sending,
    enqueue_fixture,
    fleet_runtime,
    requests_for,
    short_item,
    voicy_dev_stack,
)
from tests.kit.waiting import wait_until
from workers.voicy import outcomes, pipeline
from workers.voicy.fleet import GPU_KEY, HELD_KEY, Stage
from workers.voicy.runtime import VoicyRuntime

pytestmark = pytest.mark.slow

LEASE_TTL_MS = 2000  # a claimed job's pending grant lives this long
LEASE_EXPIRY_TIMEOUT_S = LEASE_TTL_MS / 1000 + 15.0


@pytest.fixture()
def voicy(tmp_path: Path, fresh_redis: str) -> Iterator[tuple[Any, Any, dict[str, str]]]:
    """A dev Voicy API, a fake Telegram, and the fleet environment (lease TTL 2 s)."""
    with voicy_dev_stack(tmp_path, fresh_redis, "recover", VOICY_WORKER_LEASE_TTL_MS=str(LEASE_TTL_MS)) as stack:
        yield stack


@pytest.fixture()
def rt(voicy: tuple[Any, Any, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> Iterator[VoicyRuntime]:
    """This test process as one more fleet process: same Redis, Voicy server, media store."""
    with fleet_runtime(voicy[2], monkeypatch) as runtime:
        yield runtime


def _claimed_and_abandoned(rt: VoicyRuntime, server: Any, telegram: Any, *, download: bool) -> str:
    """A job claimed (and downloaded, if asked) by a process that then died: its lease expires."""
    enqueue_fixture(server, telegram, short_item())
    job_id, token = claim_without_sending(rt)
    if download:
        assert pipeline.run_download(rt, job_id, token)
    wait_until(lambda: not rt.leases.alive(job_id), LEASE_EXPIRY_TIMEOUT_S, "the dead worker's lease to expire")
    return job_id


def test_media_in_the_store_is_returned_for_a_transcription(
        voicy: tuple[Any, Any, dict[str, str]], rt: VoicyRuntime) -> None:
    server, telegram, _env = voicy
    job_id = _claimed_and_abandoned(rt, server, telegram, download=True)
    rt.fleet.leave_gpu(job_id)  # as a transcription that died after taking its slot
    (recovery,) = pipeline.reap(rt)
    assert recovery.job_id == job_id
    assert rt.leases.holder(job_id) == f"granted:{recovery.token}"  # pending until the caller sends it
    assert rt.redis.zscore(GPU_KEY, job_id) is not None
    held = rt.fleet.get(job_id)
    assert held is not None and held.media_key and rt.store.exists(held.media_key)
    assert not requests_for(server, job_id, "failure")


def test_no_media_is_a_retryable_failure_and_the_job_is_forgotten(
        voicy: tuple[Any, Any, dict[str, str]], rt: VoicyRuntime) -> None:
    server, telegram, _env = voicy
    job_id = _claimed_and_abandoned(rt, server, telegram, download=False)
    assert pipeline.reap(rt) == []
    (failure,) = requests_for(server, job_id, "failure")
    assert failure["json"] == {"error": pipeline.WORKER_LOST, "retryable": True}
    assert rt.fleet.get(job_id) is None and rt.fleet.held_ids() == []
    assert not rt.leases.alive(job_id) and rt.redis.zscore(GPU_KEY, job_id) is None
    assert server.get_job(job_id)["status"] == "queued_for_download"


def test_recover_is_the_rule_for_a_job_the_caller_already_holds(
        voicy: tuple[Any, Any, dict[str, str]], rt: VoicyRuntime) -> None:
    """Called directly, as the bridge does after adopting a claim-ready job: the message is the caller's."""
    server, telegram, _env = voicy
    job_id = _claimed_and_abandoned(rt, server, telegram, download=True)
    held = rt.fleet.get(job_id)
    assert held is not None
    token = pipeline.adopt_claim(rt, job_id, attempts=1, language=None, stage=Stage.DOWNLOADED,
                                 media_key=held.media_key)
    assert pipeline.recover(rt, job_id, token, no_media="unused") == pipeline.Recovery(job_id, token)
    recovered = rt.fleet.get(job_id)
    assert recovered is not None and recovered.media_key is not None
    rt.store.delete(recovered.media_key)
    assert pipeline.recover(rt, job_id, token, no_media="media gone for this test") is None
    (failure,) = requests_for(server, job_id, "failure")
    assert failure["json"] == {"error": "media gone for this test", "retryable": True}
    assert rt.fleet.get(job_id) is None and not rt.leases.alive(job_id)


def test_a_job_that_ended_while_the_reaper_walked_the_held_list_is_not_failed(
        voicy: tuple[Any, Any, dict[str, str]], rt: VoicyRuntime) -> None:
    """The reaper reads the held list once and then walks it; a job whose task ended meanwhile (its
    record forgotten, then its lease released: ``outcomes.finish``) is listed, leaseless and without a
    record when the reaper reaches it. It ended: no "worker lost" failure. (A batch posting several
    results while the reaper walked made this visible: a 404 failure after a completed result.)"""
    server, telegram, _env = voicy
    enqueue_fixture(server, telegram, short_item())
    job_id, token = claim_without_sending(rt)
    lease_value = rt.leases.take(job_id, token, LEASE_TTL_MS / 1000)
    assert lease_value is not None
    outcomes.finish(rt, job_id, lease_value)  # the task's end, after its result
    rt.redis.zadd(HELD_KEY, {job_id: 0})  # ... but the reaper's list was read before it
    assert pipeline.reap(rt) == []
    assert not requests_for(server, job_id, "failure")
    assert not rt.leases.alive(job_id) and rt.fleet.held_ids() == []
