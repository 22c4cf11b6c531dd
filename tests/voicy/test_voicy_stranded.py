"""Stranded grants: a confirmed grant whose task's message no worker will run for hours.

A Voicy task is sent, then its grant confirmed for ``QUEUED_LEASE_TTL_S`` (6 h):
a queued task is safe in the broker. Two ways it is not, and the reaper's grant
audit (``workers.voicy.grants``) must recover the job in minutes, not hours:

* (a) a worker's main process takes the message from the broker and dies (or
  loses Redis) before its pool starts the task: kombu keeps the message in its
  ``unacked`` hash for the 12 h visibility timeout. Provoked for real: with no io
  worker running, the Procfile's bridge sends a download; a "thief" process
  consumes that message with kombu, as a worker's consumer does, without acking,
  and is SIGKILLed. Then io and gpu workers start.
* (b) a message lost outright (Sentinel's asynchronous replication: the BRPOP
  replicated, kombu's write into ``unacked`` not): the test deletes the queued
  transcription from the broker.

And the counterpart: a message merely *waiting* in its queue longer than the
grace (no worker free for it) is never recovered: no redo, no duplicate.

Real Redis, the dev Voicy API and fake Telegram, real Celery workers, the
Procfile's bridge and beat lines; the grace is shortened through its variable.
"""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from devstack.infra.log_budget import Allow
from devstack.infra.stack import ROOT, start_bridge
from tasks.hardening.transport import PRIORITY_SEP
from tests.kit.celery_worker import CeleryWorker
from tests.kit.procfile import start_procfile_beat
from tests.kit.voicy_stack import (
    assert_completed_once,
    enqueue_fixture,
    fleet_runtime,
    queued_tasks,
    requests_for,
    short_item,
    voicy_dev_stack,
    wait_final,
    worker_logs,
)
from tests.kit.waiting import wait_until
from workers.voicy import grants
from workers.voicy.runtime import QUEUED_LEASE_TTL_S, VoicyRuntime

if TYPE_CHECKING:
    from tests.kit.voicy_stack import VoicyDevStack as VoicyStack

# H1: each test ends with the log budget of its processes (tests/conftest.py ``log_budget``).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("log_budget")]

GRACE_MS = 5000  # VOICY_WORKER_STRANDED_GRANT_MS here: production's is a minute
GRACE_S = GRACE_MS / 1000
# Recovery comes one grace after the reaper first finds the message out of its queue; the reaper runs
# every 5 s, and a loaded 2-core box adds seconds of task latency. Anything of this order is "minutes,
# not the 6 h of the confirmed grant".
RECOVERY_BOUND_S = GRACE_S + 60.0
SEND_TIMEOUT_S = 60.0
THIEF_TIMEOUT_S = 30.0
REAP_PASSES = 2  # reaper passes that must find the waiting message queued once it is older than the grace
REAP_DONE = re.compile(r"Task voicy\.reap\[[^\]]+\] succeeded in")  # the io worker's line for each pass
RECOVERY_LOG = "grant stranded"
_A = "test_a_download_taken_by_a_worker_killed_before_it_started_is_recovered"
_B = "test_a_transcription_lost_by_the_broker_is_redispatched_and_completes_once"
LOG_BUDGET_ALLOW = (  # each applies to the test it names only (tests/conftest.py ``log_budget``)
    Allow(r"job \w+: grant stranded \(its task's message out of every queue for \d+s, ", logs=("worker-",),
          reason="the recovery each of these tests provokes", provoked_by=f"{_A} {_B}"),
    Allow(r"job \w+ failed \(retryable=True\): task lost by the broker before any worker ran it",
          logs=("worker-",), reason="the stranded download had no media: handed back to Voicy", provoked_by=_A),
    Allow(r"job \w+: redispatching transcription", logs=("worker-",),
          reason="the stranded transcription's media is stored: sent again", provoked_by=_B),
)


@pytest.fixture()
def voicy(tmp_path: Path, fresh_redis: str) -> Iterator[VoicyStack]:
    with voicy_dev_stack(tmp_path, fresh_redis, "stranded", VOICY_WORKER_STRANDED_GRANT_MS=str(GRACE_MS)) as stack:
        yield stack


@pytest.fixture()
def rt(voicy: VoicyStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[VoicyRuntime]:
    with fleet_runtime(voicy[2], monkeypatch) as runtime:
        yield runtime


def wait_sent_and_confirmed(rt: VoicyRuntime, queue: str, task: str, job_id: str) -> tuple[bytes, str]:
    """The one ``task`` message for ``job_id`` waiting in ``queue``, once its grant is confirmed; its token."""
    def found() -> tuple[bytes, str] | None:
        for queued in queued_tasks(rt.redis, queue):
            if queued.task == task and queued.args[0] == job_id:
                return queued.raw, queued.args[1]
        return None
    message = wait_until(found, SEND_TIMEOUT_S, f"the {task} message")
    raw, token = message
    wait_until(lambda: rt.redis.pttl(rt.leases.key(job_id)) > rt.pending_grant_ttl_s * 1000,
               SEND_TIMEOUT_S, "the grant to be confirmed")
    assert rt.leases.holder(job_id) == f"granted:{token}"
    return raw, token


def grant_age_s(rt: VoicyRuntime, job_id: str) -> float:
    return QUEUED_LEASE_TTL_S - rt.redis.pttl(rt.leases.key(job_id)) / 1000


def grant_older_than(rt: VoicyRuntime, job_id: str, age_s: float) -> bool:
    return grant_age_s(rt, job_id) > age_s


def assert_transcribed_once_on_its_first_claim(server: Any, job_id: str) -> None:
    """One accepted result, one ``/transcribe``, no failure posted and no second claim: nothing redone.
    The ``/transcribe`` is answered 200, or 404 when the bridge's claim-ready took the job the moment it
    was ready and moved it to transcribing first (the gpu task then carries on: it is the fleet's)."""
    assert_completed_once(server, job_id)
    assert not requests_for(server, job_id, "failure")
    moved = any(r.get("claimed") == job_id for r in server.requests_for("claim-ready"))
    assert [r["status"] for r in requests_for(server, job_id, "transcribe")] == ([404] if moved else [200])
    assert server.get_job(job_id)["attempts"] == 1


THIEF = """
import signal, sys
from kombu import Connection, Consumer, Queue

def took(body, message):  # kombu has written the message into its unacked hash before this call
    print(message.headers["task"], body[0][0], flush=True)
    signal.pause()  # never acks: the SIGKILL comes first

with Connection(sys.argv[1]) as conn:
    with Consumer(conn.channel(), [Queue(sys.argv[2])], callbacks=[took], accept=["json"]):
        conn.drain_events()
"""


def steal_and_die(redis_url: str, queue: str) -> str:
    """A worker's main process takes one message from ``queue`` (kombu, not acked) and is SIGKILLed; its line."""
    with subprocess.Popen([sys.executable, "-c", THIEF, redis_url, queue], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as thief:  # its pipe closed at the end
        try:
            assert thief.stdout is not None
            ready, _, _ = select.select([thief.stdout], [], [], THIEF_TIMEOUT_S)
            assert ready, "the thief took no message"
            line = thief.stdout.readline().decode().strip()
        finally:
            thief.send_signal(signal.SIGKILL)
            thief.wait(THIEF_TIMEOUT_S)
    return line


# ------------------------------------------------------- (a) delivered, then its worker died
def test_a_download_taken_by_a_worker_killed_before_it_started_is_recovered(
        voicy: VoicyStack, rt: VoicyRuntime, celery_workers: Callable[..., CeleryWorker], tmp_path: Path,
        fresh_redis: str) -> None:
    server, telegram, env = voicy
    job_id = enqueue_fixture(server, telegram, short_item())
    bridge = start_bridge(env, tmp_path / "bridge.log")  # the Procfile's voicy_bridge line
    beat = None
    try:
        _raw, token = wait_sent_and_confirmed(rt, "io", "voicy.download", job_id)
        assert steal_and_die(fresh_redis, "io") == f"voicy.download {job_id}"
        stranded_at = time.monotonic()
        assert rt.redis.llen("io") == 0 and rt.redis.hlen("unacked") == 1  # kombu's 12 h restore holds it
        assert rt.leases.holder(job_id) == f"granted:{token}"  # confirmed: hours, to a task nobody runs
        celery_workers("io", env)
        celery_workers("gpu", env)
        beat = start_procfile_beat(env, tmp_path / "beat.log")
        wait_until(lambda: requests_for(server, job_id, "failure"), RECOVERY_BOUND_S,
                   "the stranded download to be handed back")
        assert time.monotonic() - stranded_at < RECOVERY_BOUND_S
        wait_final(server, [job_id])
    finally:
        if beat is not None:
            beat.stop()
        bridge.stop()
    assert_completed_once(server, job_id)
    (failure,) = requests_for(server, job_id, "failure")  # no media was stored: Voicy requeued it
    assert failure["status"] == 200 and failure["json"] == {"error": grants.STRANDED_TASK, "retryable": True}
    assert server.get_job(job_id)["attempts"] == 2
    assert len([r for r in requests_for(server, job_id, "source") if r["status"] == 200]) == 1
    assert f"job {job_id}: {RECOVERY_LOG}" in worker_logs(tmp_path)
    assert "delivered to a worker that never started it" in worker_logs(tmp_path)


# ------------------------------------------------------- (b) lost by the broker
def test_a_transcription_lost_by_the_broker_is_redispatched_and_completes_once(
        voicy: VoicyStack, rt: VoicyRuntime, celery_workers: Callable[..., CeleryWorker], tmp_path: Path) -> None:
    server, telegram, env = voicy
    job_id = enqueue_fixture(server, telegram, short_item())
    celery_workers("io", env)  # downloads, and runs the reaper
    beat = start_procfile_beat(env, tmp_path / "beat.log")
    bridge = start_bridge(env, tmp_path / "bridge.log")
    try:
        raw, token = wait_sent_and_confirmed(rt, "gpu", "voicy.transcribe", job_id)
        # replication lost it: in no queue, not in unacked
        assert rt.redis.lrem("gpu", 0, raw) == 1  # type: ignore[arg-type]  # redis-py types value str; bytes work
        lost_at = time.monotonic()
        wait_until(lambda: rt.leases.holder(job_id) != f"granted:{token}", RECOVERY_BOUND_S,
                   "the reaper to replace the stranded grant")
        assert time.monotonic() - lost_at < RECOVERY_BOUND_S
        celery_workers("gpu", env)
        wait_final(server, [job_id])
    finally:
        bridge.stop()
        beat.stop()
    assert_transcribed_once_on_its_first_claim(server, job_id)  # the media was stored: not requeued
    logs = worker_logs(tmp_path)
    assert f"job {job_id}: {RECOVERY_LOG}" in logs and "in no queue nor delivery" in logs


# ------------------------------------------------------- merely waiting: never recovered
def test_a_transcription_waiting_in_its_queue_past_the_grace_is_left_alone(
        voicy: VoicyStack, rt: VoicyRuntime, celery_workers: Callable[..., CeleryWorker], tmp_path: Path) -> None:
    server, telegram, env = voicy
    job_id = enqueue_fixture(server, telegram, short_item())
    io = celery_workers("io", env)  # the reaper runs here; no gpu worker yet: the transcription waits
    beat = start_procfile_beat(env, tmp_path / "beat.log")
    bridge = start_bridge(env, tmp_path / "bridge.log")
    try:
        _raw, token = wait_sent_and_confirmed(rt, "gpu", "voicy.transcribe", job_id)
        wait_until(lambda: grant_age_s(rt, job_id) > 2 * GRACE_S, SEND_TIMEOUT_S, "the grant to outlive the grace")
        passes = len(REAP_DONE.findall(io.log()))
        wait_until(lambda: len(REAP_DONE.findall(io.log())) >= passes + REAP_PASSES, SEND_TIMEOUT_S,
                   "the reaper to audit the waiting grant")
        assert rt.leases.holder(job_id) == f"granted:{token}"  # still the queued task's
        assert [t.args for t in queued_tasks(rt.redis, "gpu")] == [[job_id, token]]
        celery_workers("gpu", env)
        wait_final(server, [job_id])
    finally:
        bridge.stop()
        beat.stop()
    assert_transcribed_once_on_its_first_claim(server, job_id)
    assert RECOVERY_LOG not in worker_logs(tmp_path)


def test_a_download_waiting_in_its_queue_past_the_grace_is_left_alone(
        voicy: VoicyStack, rt: VoicyRuntime, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No io worker at all (so none runs the reaper): this process runs the reap task's own body."""
    import tasks.voicy

    server, telegram, env = voicy
    job_id = enqueue_fixture(server, telegram, short_item())
    monkeypatch.setattr(tasks.voicy, "_runtime", rt)
    junk = (b"not json", json.dumps({"headers": {"task": "voicy.download"}, "content-type": "application/json",
                                     "body": "!!", "properties": {"body_encoding": "base64"}}))
    bridge = start_bridge(env, tmp_path / "bridge.log")
    try:
        _raw, token = wait_sent_and_confirmed(rt, "io", "voicy.download", job_id)
        # messages that are none of ours to judge: a higher-priority list and kombu's unacked hash
        rt.redis.lpush(f"io{PRIORITY_SEP}3", *junk)
        rt.redis.hset("unacked", "junk", b"[1]")
        for n in range(1, 3):  # two passes a grace apart, both past the grace
            wait_until(partial(grant_older_than, rt, job_id, (n + 1) * GRACE_S), SEND_TIMEOUT_S,
                       "the grant to outlive the grace")
            assert tasks.voicy.reap() == 0
        assert rt.leases.holder(job_id) == f"granted:{token}"
        assert [t.args for t in queued_tasks(rt.redis, "io") if t.task == "voicy.download"] == [[job_id, token]]
    finally:
        bridge.stop()
        for item in junk:  # this test's own: the xdist worker's Redis serves its later tests
            rt.redis.lrem(f"io{PRIORITY_SEP}3", 0, item)  # type: ignore[arg-type]  # redis-py types value str
        rt.redis.hdel("unacked", "junk")
    assert not requests_for(server, job_id, "failure") and server.get_job(job_id)["status"] == "downloading"
