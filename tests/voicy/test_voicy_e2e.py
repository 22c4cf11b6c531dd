"""Voicy end to end: dev Worker API + fake Telegram + real bridge, workers and Redis.

Covers the issue's end-to-end and invariant tests: 5 jobs completed with real
transcripts and progress, claim alternation and the fleet-wide backlog across
two bridges, retryable and permanent failures, a 5xx on ``result`` retried,
a 401 that stops claiming, restart recovery through ``claim-ready``, V1/V2
under SIGKILL and duplicate delivery, and S1.
"""

from __future__ import annotations

import base64
import json
import shutil
import signal
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest
import redis

from devstack.fakes.synth_media import write_video_only_mp4
from devstack.infra.log_budget import Allow
from devstack.infra.stack import AUDIO_DIR, BOT_TOKEN, VOICY_TOKEN_MARK, audio_manifest, start_beat, start_bridge
from tests.kit.celery_worker import CeleryWorker
from tests.kit.gate import Gate
from tests.kit.shared_fleet import SharedVoicyFleet, shared_voicy_fleet
from tests.kit.voicy_stack import (
    FINAL,
    JOB_DONE_TIMEOUT_S,
    RECOVERY_LEASE_TTL_MS,
    enqueue_fixture,
    gated_voicy_dev_stack,
    requests_for,
    voicy_dev_stack,
    wait_final,
)
from tests.kit.waiting import wait_until
from workers.transcribe.device import usable_cores
from workers.transcribe.settings import AUTO_CPU_THREADS
from workers.voicy.client import VoicyClient

if TYPE_CHECKING:
    from devstack.fakes.telegram import FakeTelegram
    from devstack.fakes.voicy_api import DevVoicyServer
    from tests.kit.voicy_stack import VoicyDevStack as VoicyStack

    GatedStack = tuple[DevVoicyServer, FakeTelegram, dict[str, str], Gate]  # and the gate on /progress

# H1: each test ends with the log budget of its processes (tests/conftest.py ``log_budget``).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("log_budget")]
_FAILURES = "test_failures_are_reported_with_the_right_retryable_flag"
LOG_BUDGET_ALLOW = (  # each applies to the test it names only (tests/conftest.py ``log_budget``)
    Allow(r"failed \(retryable=True\): Telegram getFile failed: HTTP 400", logs=("io",),
          reason="a job whose file Telegram does not have: a retryable failure, and Voicy requeues it",
          provoked_by=f"{_FAILURES} test_secrets_never_reach_logs_task_messages_or_results"),
    Allow(r"failed \(retryable=False\): media (has no audio stream|could not be decoded)", logs=("gpu",),
          reason="a video with no audio track and an undecodable file: permanent failures", provoked_by=_FAILURES),
    Allow(r"Voicy rejected VOICY_WORKER_TOKEN \(invalid or disabled\)", logs=("bridge",),
          reason="the bridge runs with a token Voicy refuses", provoked_by="test_401_stops_claiming_and_says_why"),
    Allow(r"failed \(retryable=True\): media not available to this fleet after a restart", logs=("bridge",),
          reason="a ready job whose media the restarted fleet does not hold goes back to Voicy for a new download",
          provoked_by="test_restart_recovers_ready_and_stale_jobs_through_claim_ready"),
    Allow(r"queue '(io|gpu)': an item that is not a task message \(.*\) was set aside in '(io|gpu)\.unreadable'",
          logs=("io", "gpu"), reason="hostile bytes pushed onto the queues: each set aside at ERROR, workers go on",
          provoked_by="test_hostile_bytes_in_a_queue_are_set_aside_and_the_workers_go_on"),
    Allow(r"job \w+: worker lost; redispatching transcription", logs=("io",),
          reason="the reaper (on the io worker) redispatches the job whose gpu worker was SIGKILLed",
          provoked_by="test_sigkill_mid_transcription_recovers_and_completes_once"),
)

STALE_HEARTBEAT_AGE = timedelta(minutes=30)  # the server's default stale cutoff is 15 minutes


@pytest.fixture()
def voicy(tmp_path: Path, fresh_redis: str) -> Iterator[VoicyStack]:
    """A dev Voicy API with a distinctive token, a fake Telegram, and the fleet environment."""
    with voicy_dev_stack(tmp_path, fresh_redis, "test") as stack:
        yield stack


@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedVoicyFleet]:
    """The running fleet (io worker of two processes, gpu worker, bridge) of the tests that only send it
    jobs and read what happened to them (tests/kit/shared_fleet.py): started once, not once per test. At
    DEBUG, so S1's test reads every line any of them logged. A test whose gpu worker is its own (two
    processes, or started once a duplicate waits) runs without the shared one; a test that kills,
    restarts or orders the start of a fleet process, or needs other settings, starts its whole fleet."""
    with shared_voicy_fleet(tmp_path_factory.mktemp("voicy-e2e-fleet"), "test", io_concurrency=2, members=(),
                            LOG_LEVEL="DEBUG") as fleet:  # each test's fixture starts the members it shares
        yield fleet


@pytest.fixture()
def shared(shared_fleet: SharedVoicyFleet, tmp_path: Path) -> Iterator[SharedVoicyFleet]:
    """The whole shared fleet for one test; what it logs meanwhile goes to this test's log budget."""
    shared_fleet.only("io", "gpu", "bridge")
    with shared_fleet.attributed(tmp_path) as fleet:
        yield fleet


@pytest.fixture()
def shared_but_gpu(shared_fleet: SharedVoicyFleet, tmp_path: Path) -> Iterator[SharedVoicyFleet]:
    """The shared io worker and bridge for a test that starts its own gpu worker (none shared runs)."""
    shared_fleet.only("io", "bridge")
    with shared_fleet.attributed(tmp_path) as fleet:
        yield fleet


def test_five_jobs_complete_with_transcripts_parts_and_progress(shared_but_gpu: SharedVoicyFleet,
                                                                 celery_workers: Callable[..., CeleryWorker]) -> None:
    server, telegram, env = shared_but_gpu.server, shared_but_gpu.telegram, shared_but_gpu.env
    manifest = sorted(audio_manifest(), key=lambda m: m["duration_s"])
    items = manifest[-5:]
    # the CPU-host recommendation, threads left to auto (not the suite's fixed count): auto-split
    gpu = celery_workers("gpu", {**env, "VOICY_WORKER_CPU_THREADS": str(AUTO_CPU_THREADS)}, concurrency=2)
    ids = {enqueue_fixture(server, telegram, item): item for item in items}
    jobs = wait_final(server, list(ids))
    for job_id, item in ids.items():
        job = jobs[job_id]
        assert job["status"] == "completed", (item["name"], job.get("lastError"),
                                              shared_but_gpu.log_of("bridge")[-2000:])
        text = job["resultText"].lower()
        for word in item["keywords"]:
            assert word.lower() in text, (item["name"], word, text)
        assert job["resultParts"] and all(p["timeCode"] for p in job["resultParts"])
        assert job["workerEngine"] == "faster-whisper"
        assert [r["status"] for r in requests_for(server, job_id, "result")] == [200]
    longest = max(ids, key=lambda j: ids[j]["duration_s"])
    assert len(requests_for(server, longest, "progress")) >= 1
    # media is deleted after the result (just after the /result response: await it)
    work = Path(env["VOICY_WORKER_WORK_DIR"])
    assert work.is_dir()
    wait_until(lambda: not any(next(work.glob(f"{j}.*"), None) for j in ids), 30, "the media to be deleted")
    # the worker's parent handed its pool size to the engine: the cores are split between both processes
    cores = usable_cores()
    assert f"cpu_threads={max(1, cores // 2)} (auto: {cores} usable cores / 2 pool processes)" in gpu.log()
    # a CPU engine's pool child leaves its host threads alone (only a CUDA engine sets OMP_NUM_THREADS=1)
    assert "OMP_NUM_THREADS" in env or "host threads unchanged (cpu: the libraries' defaults)" in gpu.log()


def test_claims_alternate_and_backlog_limit_holds_across_two_bridges(voicy: VoicyStack, tmp_path: Path) -> None:
    server, telegram, env = voicy
    limit = 3
    env = dict(env, VOICY_WORKER_READY_QUEUE_LIMIT=str(limit))
    env_b = dict(env, VOICY_WORKER_TOKEN=server.create_client("second", token=VOICY_TOKEN_MARK + "-b"))
    item = audio_manifest()[0]
    ids = [enqueue_fixture(server, telegram, item, file_id=f"fid-{n}") for n in range(8)]
    # No workers run: claimed jobs stay in the backlog, so the limit must stop both bridges.
    bridges = [start_bridge(env, tmp_path / "a.log"), start_bridge(env_b, tmp_path / "b.log")]
    try:
        for client in ("switchyard-test", "second"):
            def polled(c: str = client) -> bool:
                return sum(1 for r in server.requests if r["path"].endswith("claim-ready") and r["client"] == c) >= 5

            wait_until(polled, 30, f"bridge {client} to keep polling")
    finally:
        for b in bridges:
            b.stop()
    claims = [r for r in server.requests if r["path"].endswith("claim-download")]
    won = [r for r in claims if r["status"] == 200]
    assert len(won) == limit
    downloading = {str(j["_id"]) for j in server.db.transcriptionjobs.find({"status": "downloading"})}
    assert len(downloading) == limit
    # the first "newest" claim takes the newest job; "oldest" claims take from the front
    newest_wins = sum(1 for r in won if r["json"].get("bucket") == "newest")
    assert (ids[-1] in downloading) == (newest_wins > 0)
    assert ids[0] in downloading
    sequences = [[(r["json"] or {}).get("bucket", "oldest") for r in claims if r["client"] == c]
                 for c in ("switchyard-test", "second")]
    for buckets in sequences:
        assert buckets == ["oldest", "newest"] * (len(buckets) // 2) + ["oldest"] * (len(buckets) % 2)
    assert sum(len(b) for b in sequences) >= limit


def test_failures_are_reported_with_the_right_retryable_flag(shared: SharedVoicyFleet, tmp_path: Path) -> None:
    server, telegram = shared.server, shared.telegram
    missing = server.enqueue_job("fid-not-on-telegram", mime_type="audio/ogg")
    telegram.add_file("fid-garbage", (AUDIO_DIR / "undecodable.ogg").read_bytes())
    garbage = server.enqueue_job("fid-garbage", mime_type="audio/ogg")
    # a screen recording sent as a video: decodable, but there is no audio to transcribe
    telegram.add_file("fid-video-only", write_video_only_mp4(tmp_path / "video-only.mp4").read_bytes())
    video = server.enqueue_job("fid-video-only", mime_type="video/mp4", source_kind="video")
    wait_until(lambda: all(requests_for(server, j, "failure") for j in (missing, garbage, video)),
               JOB_DONE_TIMEOUT_S, "the three failures")
    assert requests_for(server, missing, "failure")[0]["json"]["retryable"] is True
    assert requests_for(server, garbage, "failure")[0]["json"]["retryable"] is False
    assert server.get_job(garbage)["status"] == "failed"
    video_failures = requests_for(server, video, "failure")
    assert [r["json"] for r in video_failures] == [{"error": "media has no audio stream", "retryable": False}]
    assert server.get_job(video)["status"] == "failed" and server.get_job(video)["attempts"] == 1  # not re-downloaded
    # a failure message never carries the bot token
    for r in requests_for(server, missing, "failure"):
        assert BOT_TOKEN not in json.dumps(r["json"])


def test_voicy_5xx_on_result_is_retried_not_lost(shared: SharedVoicyFleet) -> None:
    server, telegram = shared.server, shared.telegram
    item = sorted(audio_manifest(), key=lambda m: m["duration_s"])[0]
    server.inject_failure("result", status=503, times=2)  # no other job is in flight: the fleet is quiet
    job_id = enqueue_fixture(server, telegram, item)
    jobs = wait_final(server, [job_id])
    assert jobs[job_id]["status"] == "completed"
    statuses = [r["status"] for r in requests_for(server, job_id, "result")]
    assert statuses[:2] == [503, 503] and statuses[-1] == 200
    assert not requests_for(server, job_id, "failure")


def test_401_stops_claiming_and_says_why(voicy: VoicyStack, tmp_path: Path) -> None:
    server, telegram, env = voicy
    env = dict(env, VOICY_WORKER_TOKEN="not-a-valid-token-xyz")
    bridge = start_bridge(env, tmp_path / "bridge.log")
    try:
        wait_until(lambda: "invalid or disabled" in bridge.log(), 30, "the token error")
        n = len(server.requests)
        assert bridge.proc.poll() is None  # it keeps running, checking slowly
    finally:
        bridge.stop()
    assert len(server.requests) <= n + 1  # no claim storm after the 401
    assert all(r["status"] == 401 for r in server.requests)
    assert "not-a-valid-token-xyz" not in bridge.log()


def test_restart_recovers_ready_and_stale_jobs_through_claim_ready(voicy: VoicyStack,
                                                                    celery_workers: Callable[..., CeleryWorker],
                                                                    tmp_path: Path) -> None:
    """After a restart with Redis flushed, this worker's jobs left ``ready`` or stale ``transcribing``
    on the server come back through ``claim-ready``, alternating buckets (reference §6.3): media
    still in the store is transcribed without a new download; media gone is a retryable failure,
    so Voicy requeues the job and it is downloaded afresh."""
    server, telegram, env = voicy
    env = dict(env, VOICY_WORKER_TRANSCRIPTION_CONCURRENCY="3")  # room to recover all three in one pass
    work = Path(env["VOICY_WORKER_WORK_DIR"])
    work.mkdir(parents=True, exist_ok=True)
    # createdAt and downloadedAt ascend in this order, so "oldest" and "newest" are unambiguous
    names = ("ready_stored", "stale_stored", "ready_missing", "fresh_transcribing")
    items = dict(zip(names, sorted(audio_manifest(), key=lambda m: m["duration_s"])[:len(names)], strict=True))
    ids = {name: enqueue_fixture(server, telegram, items[name], file_id=f"fid-{name}") for name in names}
    by_id = {job_id: name for name, job_id in ids.items()}

    # The process before the restart: claimed and downloaded all four, started transcribing two.
    previous = VoicyClient(server.url, env["VOICY_WORKER_TOKEN"], timeout_s=5)
    for name in names:
        job = previous.claim_download("oldest")
        assert job is not None and job.id == ids[name]
        media = work / f"{job.id}.ogg"
        if name != "ready_missing":  # its media was on a host that is gone
            shutil.copyfile(AUDIO_DIR / items[name]["file"], media)
        previous.downloaded(job.id, str(media))
    for name in ("stale_stored", "fresh_transcribing"):
        previous.transcribe(ids[name])
    previous.close()  # that process is gone
    server.update_job(ids["stale_stored"], {"heartbeatAt": server.state.now() - STALE_HEARTBEAT_AGE})
    seen_requests, seen_edits = len(server.requests), len(server.edits)

    celery_workers("io", env)
    celery_workers("gpu", env)
    bridge = start_bridge(env, tmp_path / "bridge.log")
    try:
        recovered = [ids[n] for n in ("ready_stored", "stale_stored", "ready_missing")]
        jobs = wait_final(server, recovered)
    finally:
        bridge.stop()
    after = server.requests[seen_requests:]

    # The bridge's first recovery pass: oldest, newest, oldest, then nothing left in either bucket.
    ready_claims = [(r["bucket"], r["status"]) for r in after if r["endpoint"] == "claim-ready"]
    assert ready_claims[:5] == [("oldest", 200), ("newest", 200), ("oldest", 200), ("newest", 204),
                                ("oldest", 204)], ready_claims
    # Each claim-ready that returns a job publishes its "processing" edit: which job each bucket took.
    taken = [by_id[e["jobId"]] for e in server.edits[seen_edits:] if e["phase"] == "processing"]
    assert taken[:3] == ["ready_stored", "ready_missing", "stale_stored"], taken
    assert "fresh_transcribing" not in taken  # its heartbeat is fresh: not ours to recover
    assert server.get_job(ids["fresh_transcribing"])["status"] == "transcribing"

    for name in ("ready_stored", "stale_stored"):  # media in the store: transcribed, not re-downloaded
        job_id = ids[name]
        assert jobs[job_id]["status"] == "completed", (name, jobs[job_id].get("lastError"), bridge.log()[-2000:])
        assert jobs[job_id]["attempts"] == 1
        assert not [r for r in after if r.get("job_id") == job_id and r["endpoint"] in ("source", "failure")]
        assert [r["status"] for r in after if r.get("job_id") == job_id and r["endpoint"] == "result"] == [200]
        for word in items[name]["keywords"]:
            assert word.lower() in jobs[job_id]["resultText"].lower(), (name, word)
        def deleted(j: str = job_id) -> bool:
            return not (work / f"{j}.ogg").exists()

        wait_until(deleted, 30, "the media deleted after the result")

    missing = ids["ready_missing"]  # no media: handed back retryable, requeued, downloaded again
    failures = [r["json"] for r in after if r.get("job_id") == missing and r["endpoint"] == "failure"]
    assert failures == [{"error": "media not available to this fleet after a restart", "retryable": True}]
    assert jobs[missing]["status"] == "completed" and jobs[missing]["attempts"] == 2
    assert any(r["endpoint"] == "claim-download" and r["status"] == 200 for r in after)
    assert [r["status"] for r in after if r.get("job_id") == missing and r["endpoint"] == "source"] == [200]


@pytest.fixture()
def voicy_mid_transcription(tmp_path: Path, fresh_redis: str,
                            monkeypatch: pytest.MonkeyPatch) -> Iterator[GatedStack]:
    """The stack with a gate on ``/progress``: a transcription held mid-way for as long as the test likes."""
    gate = Gate.path_suffix("/progress", once=True)  # once: the replacement's progress goes through
    with gated_voicy_dev_stack(gate, monkeypatch, tmp_path, fresh_redis, "test") as (server, telegram, env):
        yield server, telegram, env, gate


def test_sigkill_mid_transcription_recovers_and_completes_once(voicy_mid_transcription: GatedStack,
                                                              celery_workers: Callable[..., CeleryWorker],
                                                              tmp_path: Path) -> None:
    """V1 + V2: kill the gpu worker while it transcribes; the reaper redispatches; one result.

    Only the worker that dies holds the recovery lease TTL (its lease must expire within the test); the
    rest of the fleet, the replacement included, holds production's, so no live lease is lost to a
    loaded box's stall (a lost one would be recovered twice, or not posted: the fence)."""
    server, telegram, env, gate = voicy_mid_transcription
    longest = max(audio_manifest(), key=lambda m: m["duration_s"])
    job_id = enqueue_fixture(server, telegram, longest)
    gate.arm()
    celery_workers("io", env)
    gpu = celery_workers("gpu", {**env, "VOICY_WORKER_LEASE_TTL_MS": str(RECOVERY_LEASE_TTL_MS)})
    beat = start_beat(env, tmp_path, tmp_path / "beat.log")
    bridge = start_bridge(env, tmp_path / "bridge.log")
    try:
        assert gate.arrived.wait(JOB_DONE_TIMEOUT_S), "the transcription never reported progress"
        gpu.kill(signal.SIGKILL)  # mid-transcription: its first progress call is held
        gate.drop()  # that call dies on the wire with its worker
        assert server.get_job(job_id)["status"] == "transcribing"
        celery_workers("gpu", env)  # a replacement host comes up
        jobs = wait_final(server, [job_id])
    finally:
        bridge.stop()
        beat.stop()
    assert jobs[job_id]["status"] == "completed"
    assert [r["status"] for r in requests_for(server, job_id, "result")] == [200]
    assert not requests_for(server, job_id, "failure")
    assert "redispatching transcription" in beat.log() or "redispatching" in "".join(
        p.read_text() for p in tmp_path.glob("worker-*.log"))


def redis_plaintext(r: redis.Redis) -> list[bytes]:
    """Every value in Redis as readable bytes: strings, hashes, lists, sets and sorted sets read
    member by member (``DUMP`` is compressed, so a secret inside it would not show), and kombu
    message bodies (base64 in the JSON envelope) decoded too."""
    # ``r`` decodes no reply (no decode_responses): each is bytes, where redis-py's types say bytes | str
    out: list[bytes] = []
    for key in r.scan_iter("*"):
        kind = cast("bytes", r.type(key)).decode()
        if kind == "string":
            values = [cast("bytes | None", r.get(key)) or b""]
        elif kind == "hash":
            values = [k + b"=" + v for k, v in cast("dict[bytes, bytes]", r.hgetall(key)).items()]
        elif kind == "list":
            values = cast("list[bytes]", r.lrange(key, 0, -1))
        elif kind == "set":
            values = list(cast("set[bytes]", r.smembers(key)))
        elif kind == "zset":
            values = [m for m, _ in cast("list[tuple[bytes, float]]", r.zrange(key, 0, -1, withscores=True))]
        else:
            values = []
        for value in [key, *values]:
            out.append(value)
            try:
                body = json.loads(value).get("body")
                out.append(base64.b64decode(body) if isinstance(body, str) else b"")
            except (ValueError, AttributeError, TypeError):
                pass
    return out


def test_secrets_never_reach_logs_task_messages_or_results(shared: SharedVoicyFleet) -> None:
    """S1: the Voicy token and the bot token appear in no log, task message or Redis value."""
    server, telegram, env = shared.server, shared.telegram, shared.env
    item = sorted(audio_manifest(), key=lambda m: m["duration_s"])[0]
    assert env["LOG_LEVEL"] == "DEBUG"  # every process of the fleet logs everything it may
    r = redis.Redis.from_url(shared.redis_url)
    seen: list[bytes] = []
    job_id = enqueue_fixture(server, telegram, item)
    bad = server.enqueue_job("fid-missing-for-s1", mime_type="audio/ogg")

    def scanned_until_final() -> bool:  # every value Redis holds while the jobs run, not one snapshot
        seen.extend(redis_plaintext(r))
        return all(server.get_job(j)["status"] in FINAL for j in (job_id, bad))

    wait_until(scanned_until_final, 120, "both jobs to end, scanning Redis meanwhile")
    seen.extend(redis_plaintext(r))
    blobs = b"".join(seen).decode(errors="replace")
    assert job_id in blobs  # the scan reads values as text: the job's own records and task messages show
    logs = shared.text()  # every line the fleet logged since it started, this test's and the others'
    assert f"job {job_id}" in logs
    failures = json.dumps([q["json"] for q in server.requests if q["path"].endswith("/failure")])
    bot_secret = BOT_TOKEN.split(":", 1)[1]
    for secret in (env["VOICY_WORKER_TOKEN"], BOT_TOKEN, bot_secret):
        assert secret not in logs
        assert secret not in blobs
        assert secret not in failures


def test_duplicate_delivery_transcribes_once(shared_but_gpu: SharedVoicyFleet,
                                            celery_workers: Callable[..., CeleryWorker], tmp_path: Path) -> None:
    """V2: a second copy of the same gpu task message does nothing."""
    server, telegram, env = shared_but_gpu.server, shared_but_gpu.telegram, shared_but_gpu.env
    item = sorted(audio_manifest(), key=lambda m: m["duration_s"])[0]
    r = redis.Redis.from_url(shared_but_gpu.redis_url)
    assert r.llen("gpu") == 0
    job_id = enqueue_fixture(server, telegram, item)
    wait_until(lambda: r.llen("gpu") == 1, 60, "the transcription task to be queued")
    message = r.lindex("gpu", 0)
    assert message is not None
    r.lpush("gpu", message)  # exactly what a broker redelivery looks like
    celery_workers("gpu", env)
    jobs = wait_final(server, [job_id])
    wait_until(lambda: r.llen("gpu") == 0, 30, "the duplicate to be consumed")
    assert jobs[job_id]["status"] == "completed"
    assert len(requests_for(server, job_id, "transcribe")) <= 1
    assert len(requests_for(server, job_id, "result")) == 1
    # The queue empties when the worker fetches the duplicate, before it refuses it: await the refusal.
    wait_until(lambda: "already owned by another execution" in "".join(
        p.read_text() for p in tmp_path.glob("worker-*gpu*.log")), 30, "the duplicate's refusal in the gpu log")


HOSTILE_ITEMS = (b"not json", b"\xff\xfe\x00garbage", b"[1]", b"")


def test_hostile_bytes_in_a_queue_are_set_aside_and_the_workers_go_on(shared: SharedVoicyFleet) -> None:
    """Items that are not task messages, pushed onto both queues ahead of a real job: each worker sets
    every one aside, exactly as pushed, in ``<queue>.unreadable`` with an ERROR naming its queue and
    cause, and goes on to complete the job (kombu's own read raised, and Celery stopped the worker)."""
    server, telegram = shared.server, shared.telegram
    r = redis.Redis.from_url(shared.redis_url)
    for queue in ("io", "gpu"):
        r.lpush(queue, *HOSTILE_ITEMS)  # consumed first: kombu publishes with LPUSH and pops the other end
    job_id = enqueue_fixture(server, telegram, sorted(audio_manifest(), key=lambda m: m["duration_s"])[0])
    assert wait_final(server, [job_id])[job_id]["status"] == "completed"
    for queue in ("io", "gpu"):
        def set_aside(queue: str = queue) -> bool:
            return r.llen(f"{queue}.unreadable") == len(HOSTILE_ITEMS)

        wait_until(set_aside, 30, f"{queue}'s hostile items set aside")
        assert sorted(r.lrange(f"{queue}.unreadable", 0, -1)) == sorted(HOSTILE_ITEMS)
        r.delete(f"{queue}.unreadable")
    logs = shared.text()
    for queue in ("io", "gpu"):
        assert logs.count(f"queue '{queue}': an item that is not a task message (") == len(HOSTILE_ITEMS)
    assert "(JSONDecodeError: Expecting value" in logs and "(JSON list, not an object" in logs
    assert "Unrecoverable error" not in logs
