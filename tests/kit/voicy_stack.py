"""A Voicy test stack: the dev Worker API and fake Telegram for one test, this process as a fleet member,
and the helpers the Voicy end-to-end tests share (enqueue a fixture, read the server's request log, a grant
taken by a process that died before sending its task, the task messages waiting in a broker queue).

The pieces the demo and the benchmarks share with the tests (fixtures, tiny
model, ``fleet_env``, ``start_bridge``, ``start_beat``) live in
``devstack.infra.stack``; only test plumbing is here.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from bridges.voicy import VoicyBridge
from devstack.infra.procs import Proc
from devstack.infra.stack import AUDIO_DIR, BOT_TOKEN, VOICY_TOKEN_MARK, audio_manifest, fleet_env, start_bridge
from tests.kit.celery_worker import CeleryWorker
from tests.kit.gate import Gate
from tests.kit.procfile import assert_alive, start_procfile_beat
from tests.kit.waiting import wait_until
from workers.voicy.runtime import VoicyRuntime

if TYPE_CHECKING:  # imported where used: the dev server and fake pull in the web stack
    from devstack.fakes.telegram import FakeTelegram
    from devstack.fakes.voicy_api import DevVoicyServer

    VoicyDevStack = tuple[DevVoicyServer, FakeTelegram, dict[str, str]]  # the server, Telegram, the fleet env

JOB_DONE_TIMEOUT_S = 180.0
FINAL = ("completed", "failed")
# The lease TTL of a test that proves recovery: a dead holder's lease (or an unconfirmed grant) expires
# this soon, and the reaper (every TTL / 2 here) finds the job. Not shorter: the keeper renews every
# TTL / 3 (workers.lease.RENEWALS_PER_TTL), so a live lease survives a stall of only two thirds of a TTL
# (4 s: a process starved or holding the GIL on a loaded 2-core box; 2 s TTLs lost leases at load 15),
# and a pending grant must be confirmed within one TTL. Every other test runs production's 30 s.
RECOVERY_LEASE_TTL_MS = 6000
# CTranslate2 threads of every engine the suite loads (gpu fleet processes and in-process engines).
# ``make test`` runs several xdist workers, each with its fleet, on the 2-core box: the cores are
# already shared between processes, as the auto rule (workers.transcribe.device) would share them in a
# pool that large. Two threads (what auto gives one process on 2 cores) cost 15-30 % more CPU for the
# same transcripts (tiny.en, the fixtures and the demo's message: identical text with 1 and 2) and
# no faster wall clock on a busy box. Tests of the auto rule itself pass ``AUTO_CPU_THREADS``.
SUITE_CPU_THREADS = 1
# How often the suite's Voicy bridges ask for work (ms; production's default is 1000, the demo's 200).
# Each ask is an HTTP round trip to the dev Voicy API (served in the pytest process) and the bridge's
# Redis bookkeeping: at 200 ms an idle bridge and its server burnt 0.038 CPU-s per second, at 400 ms
# 0.025, and make test starts about 40 Voicy bridges, each running for tens of seconds. A claim then
# waits at most 0.2 s longer; no test bounds a claim that tightly.
SUITE_POLL_INTERVAL_MS = 400


READY_TIMEOUT_S = 60.0  # a worker's "ready." line after its start (imports, the pool's children)


@dataclass
class VoicyFleet:
    """The Voicy side of the Procfile as its own processes: io and gpu workers, the Voicy bridge, beat."""

    io: CeleryWorker
    gpu: CeleryWorker
    bridge: Proc
    beat: Proc

    def logs(self, tail_chars: int | None = None) -> str:
        """Every member's log under its name (each cut to its last ``tail_chars``, if given)."""
        members = (("io", self.io.log()), ("gpu", self.gpu.log()), ("bridge", self.bridge.log()),
                   ("beat", self.beat.log()))
        return "\n".join(f"--- {name}\n{text[-tail_chars:] if tail_chars else text}" for name, text in members)

    def assert_alive(self) -> None:
        assert_alive({"io": self.io.proc.poll, "gpu": self.gpu.proc.poll, "bridge": self.bridge.proc.poll,
                      "beat": self.beat.proc.poll}, self.logs)


def _ready_or_gone(worker: CeleryWorker) -> bool:
    """The worker logged ``ready.``, or exited (the caller then reads its log)."""
    return " ready." in worker.log() or worker.proc.poll() is not None


@contextmanager
def voicy_fleet(env: dict[str, str], tmp: Path, *, io_concurrency: int = 1,
                beat_env: dict[str, str] | None = None) -> Iterator[VoicyFleet]:
    """Start the workers (ready: their own "ready." line, which a Sentinel URL's fleet logs too), then the
    bridge and beat (``beat_env`` added to its environment: a fleet that also runs a Cairn pool); stop the
    bridge and beat first, the workers last."""
    io = CeleryWorker("io", env, tmp / "io.log", concurrency=io_concurrency)
    gpu = CeleryWorker("gpu", env, tmp / "gpu.log", concurrency=1)
    started: list[CeleryWorker | Proc] = [io, gpu]
    try:
        for worker in (io, gpu):
            wait_until(partial(_ready_or_gone, worker), READY_TIMEOUT_S, f"{worker.queues} worker to be ready")
        bridge = start_bridge(env, tmp / "bridge.log")
        started.append(bridge)
        beat = start_procfile_beat({**env, **(beat_env or {})}, tmp / "beat.log")
        started.append(beat)
        yield VoicyFleet(io, gpu, bridge, beat)
    finally:
        for member in reversed(started):
            member.stop()


@contextmanager
def voicy_dev_stack(tmp_path: Path, redis_url: str, client: str,
                    **env_overrides: str) -> Iterator[VoicyDevStack]:
    """A started dev Voicy API and fake Telegram, a worker client named ``client`` with a
    distinctive token (``VOICY_TOKEN_MARK-<client>``), and the fleet environment for them (engines on
    :data:`SUITE_CPU_THREADS`, bridges polling every :data:`SUITE_POLL_INTERVAL_MS`, unless
    ``env_overrides`` says otherwise)."""
    from devstack.fakes.telegram import FakeTelegram
    from devstack.fakes.voicy_api import DevVoicyServer

    server = DevVoicyServer().start()
    telegram = FakeTelegram(BOT_TOKEN)
    telegram.start()
    try:
        token = server.create_client(f"switchyard-{client}", token=f"{VOICY_TOKEN_MARK}-{client}")
        env = fleet_env(redis_url=redis_url, api_url=server.url, token=token, telegram_url=telegram.url,
                        work_dir=tmp_path / "work",
                        **{"VOICY_WORKER_CPU_THREADS": str(SUITE_CPU_THREADS),
                           "VOICY_WORKER_POLL_INTERVAL_MS": str(SUITE_POLL_INTERVAL_MS), **env_overrides})
        yield server, telegram, env
    finally:
        telegram.clear_faults()
        telegram.stop()
        server.stop()


@contextmanager
def gated_voicy_dev_stack(gate: Gate, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_url: str, client: str,
                          **env_overrides: str) -> Iterator[VoicyDevStack]:
    """:func:`voicy_dev_stack` with its dev Voicy API behind ``gate`` (a call held for as long as the
    test likes); the gate opens before the server stops, so a held request never keeps it waiting."""
    from devstack.fakes.voicy_api import server as server_module

    build_app = server_module.build_app
    monkeypatch.setattr(server_module, "build_app", lambda state: gate.wrap(build_app(state)))
    with voicy_dev_stack(tmp_path, redis_url, client, **env_overrides) as stack:
        try:
            yield stack
        finally:
            gate.open()


@contextmanager
def fleet_runtime(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[VoicyRuntime]:
    """This test process as one more fleet process (same Redis, Voicy server, media store) under ``env``'s
    ``VOICY_*`` settings; ``monkeypatch`` restores the process environment afterwards."""
    for key in list(os.environ):
        if key.startswith("VOICY_") or key == "TOKEN":
            monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("VOICY_"):
            monkeypatch.setenv(key, value)
    runtime = VoicyRuntime.from_env(env["REDIS_URL"])
    try:
        yield runtime
    finally:
        runtime.close()


def enqueue_fixture(server: DevVoicyServer, telegram: FakeTelegram, item: dict, file_id: str | None = None) -> str:
    """Serve the audio fixture ``item`` from fake Telegram and enqueue a job for it; return its id."""
    data = (AUDIO_DIR / item["file"]).read_bytes()
    file_id = file_id or f"fid-{item['name']}"
    telegram.add_file(file_id, data)
    return server.enqueue_job(file_id, file_size=len(data), mime_type="audio/ogg")


def requests_for(server: DevVoicyServer, job_id: str, endpoint: str) -> list[dict]:
    """The requests the dev Voicy API recorded for ``job_id``'s ``endpoint`` (``result``, ``progress`` ...)."""
    return [r for r in server.requests if r["path"].endswith(f"/jobs/{job_id}/{endpoint}")]


def wait_final(server: DevVoicyServer, job_ids: list[str], timeout_s: float = JOB_DONE_TIMEOUT_S) -> dict[str, dict]:
    """Every job of ``job_ids`` once all are final (completed or failed)."""
    def done() -> dict[str, dict] | None:
        jobs = {j: server.get_job(j) for j in job_ids}
        return jobs if all(job["status"] in FINAL for job in jobs.values()) else None
    return wait_until(done, timeout_s, "jobs to reach a final state", interval_s=0.2)


def never_sent(_rt: VoicyRuntime, _job_id: str, _token: str) -> None:
    """The bridge process dies right after granting: the task is never sent, nothing is confirmed."""


def claim_without_sending(rt: VoicyRuntime) -> tuple[str, str]:
    """Run the real bridge pass up to its send; return the claimed job and its (unsent) token."""
    assert VoicyBridge(rt, never_sent, never_sent).cycle() == 1
    (job_id,) = rt.fleet.held_ids()
    holder = rt.leases.holder(job_id) or ""
    assert holder.startswith("granted:")
    return job_id, holder.removeprefix("granted:")


def worker_logs(tmp_path: Path) -> str:
    """Every ``celery_workers`` log of a test, joined."""
    return "".join(p.read_text(errors="replace") for p in tmp_path.glob("worker-*.log"))


def assert_completed_once(server: DevVoicyServer, job_id: str) -> None:
    """The job completed, and Voicy accepted exactly one result for it."""
    job = server.get_job(job_id)
    assert job["status"] == "completed", job.get("lastError")
    assert len([r for r in requests_for(server, job_id, "result") if r["status"] == 200]) == 1


def short_item() -> dict:
    """The shortest audio fixture (the quickest job)."""
    return min(audio_manifest(), key=lambda m: m["duration_s"])


@dataclass(frozen=True)
class QueuedTask:
    """A Celery task message waiting in a broker queue, as a test reads it."""

    raw: bytes  # the list item itself (a test that plays the broker losing it removes exactly this)
    task: str
    argsrepr: str  # what Flower and task events show
    args: list[Any]


def queued_tasks(r: redis.Redis, queue: str) -> list[QueuedTask]:
    """Every task message waiting in ``queue`` (kombu's Redis list), oldest last, decoded independently
    of ``tasks.hardening.transport`` so a test of the grant audit does not read the broker through the code it tests."""
    tasks = []
    for raw in r.lrange(queue, 0, -1):
        message = json.loads(raw)
        headers = message["headers"]
        item = raw if isinstance(raw, bytes) else raw.encode()
        tasks.append(QueuedTask(item, headers["task"], headers.get("argsrepr", ""),
                                json.loads(base64.b64decode(message["body"]))[0]))
    return tasks
