"""Flower lets an operator find a Cairn job (issue 14 §5).

A real Flower (the Procfile's ``web`` line) watches a real Cairn pool: a
``fetch_source`` job shows its kind and job id first in the ``args`` column
(on by default), and Flower's search box finds it by the job id; its lease
token stays masked (S1).
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
import redis

from devstack.infra.procfile import entries
from devstack.infra.procs import Proc, spawn
from devstack.infra.services import free_port
from tests.kit.cairn_stack import ROOT, WAIT_S, CairnStack, running_stack
from tests.kit.waiting import wait_until

pytestmark = pytest.mark.xdist_group("flower_jobs")  # one worker runs the module's stack

SHELL = shutil.which("bash") or "/bin/sh"
HTTP_TIMEOUT_S = 5.0
FLOWER_USER = "admin"
LEASE_KEYS = "sy:lease:cairn:*"


class Flower:
    """``celery -A tasks flower`` as the Procfile's ``web`` line runs it, and its authenticated API."""

    def __init__(self, stack: CairnStack) -> None:
        self.port, self.password = free_port(), f"pw-{uuid.uuid4().hex}"
        env = stack.env | {"PORT": str(self.port), "FLOWER_PASSWORD": self.password, "FLOWER_ADDRESS": "127.0.0.1",
                           "PATH": f"{ROOT / '.venv' / 'bin'}:{stack.env.get('PATH', '')}"}
        self.proc: Proc = spawn([SHELL, "-c", entries()["web"]], env, stack.tmp / "flower.log")
        wait_until(lambda: "Visit me at" in self.proc.log() or self.proc.proc.poll() is not None, WAIT_S,
                   "Flower to listen")
        assert self.proc.proc.poll() is None, self.proc.log()[-3000:]
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", auth=(FLOWER_USER, self.password),
                                 timeout=HTTP_TIMEOUT_S)

    def wait_capturing(self, node: str) -> None:
        """Flower has received an event from ``node`` (a heartbeat: it counts the worker online), so it
        captures events now; a task finished before that would be missing from its list for good."""
        online = f'flower_worker_online{{worker="{node}"}} 1.0'
        wait_until(lambda: online in self.http.get("/metrics").text, WAIT_S, f"Flower to see {node} online")

    def tasks(self) -> dict[str, dict[str, Any]]:
        return self.http.get("/api/tasks").json()

    def search(self, text: str) -> list[dict[str, Any]]:
        """The task list's search box, as the page's datatable asks for it."""
        params = {"draw": "1", "start": "0", "length": "50", "search[value]": text,
                  "order[0][column]": "0", "order[0][dir]": "desc", "columns[0][data]": "received"}
        return self.http.get("/tasks/datatable", params=params).json()["data"]

    def stop(self) -> None:
        self.http.close()
        self.proc.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_endpoint: str) -> Iterator[CairnStack]:
    with running_stack(tmp_path_factory.mktemp("flower-jobs"), redis_url, s3_endpoint) as s:
        yield s


@pytest.fixture(scope="module")
def flower(stack: CairnStack) -> Iterator[Flower]:
    f = Flower(stack)
    try:
        f.wait_capturing(stack.workers[0].name)
        yield f
    finally:
        f.stop()


def _finished_job(flower: Flower, job_id: str) -> dict[str, Any] | None:
    return next((t for t in flower.tasks().values() if job_id in str(t.get("args")) and t.get("state") == "SUCCESS"),
                None)


@pytest.mark.slow
def test_a_cairn_job_shows_its_kind_and_id_and_search_finds_it(stack: CairnStack, flower: Flower) -> None:
    acct = stack.connect_athlete(n_activities=1)
    job = stack.fetch_job(acct, stack.first_activity_id(acct))
    r = redis.Redis.from_url(stack.redis_url)
    tokens: set[str] = set()

    def leases() -> bool:  # the tokens the bridge granted, read while a task may hold its lease
        tokens.update(v.decode().split(":")[1] for k in r.scan_iter(LEASE_KEYS)
                      if (v := cast("bytes | None", r.get(k))))  # bytes: a client without decode_responses
        return _finished_job(flower, job["job_id"]) is not None

    stack.core.enqueue_job("fetch_source", job)
    wait_until(leases, WAIT_S, "Flower to show the job finished")
    task = _finished_job(flower, job["job_id"])
    assert task is not None and task["name"] == "cairn.job", task
    assert str(task["args"]).startswith(f"['fetch_source', {{'job_id': '{job['job_id']}', "), task["args"]
    assert "'lease_token': '…'" in task["args"]
    found = flower.search(job["job_id"])
    assert [t["uuid"] for t in found] == [task["uuid"]], found
    # the list shows one short line: kind, the whole job id, then account, pool and delivery
    assert found[0]["args"] == (f"fetch_source {job['job_id']} (account {acct.account_id}, "
                                f"pool {stack.pool}, delivery 1)"), found
    page = flower.http.get("/tasks").text
    columns = re.findall(r'<th data-column="(\w+)">', page)
    assert columns[:4] == ["name", "state", "worker", "args"], columns  # the worker before the long args
    shown = flower.http.get("/api/tasks").text + page
    assert tokens and not [t for t in tokens if t in shown]



def test_a_reconcile_child_shows_its_whole_id_first_and_other_args_unchanged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids a reconcile spawns share its id as a long prefix: the list's line leads with the whole id."""
    monkeypatch.setenv("FLOWER_PASSWORD", "pw")  # the module refuses to load without authentication
    from deploy import flowerconfig

    reconcile = "rec-2b7f0e0c-1111-2222-3333-444455556666-1712345678"
    payload = {"job_id": f"{reconcile}:9876543210", "account_id": "acct-1", "user_id": "user-1",
               "provider": "strava", "ext_id": "9876543210", "fetch_streams": True, "reason": "backfill"}
    meta = {"stream": "CAIRN_JOBS", "seq": 7, "stamp": 1.5, "delivery": 2, "subject": "cairn.jobs.x",
            "lease_token": "…", "pool": "strava-fetcher"}
    task = SimpleNamespace(name="cairn.job", args=repr(["fetch_source", payload, meta]), kwargs="{}", result=None)
    shown = flowerconfig.format_task(task).args
    assert shown == f"fetch_source {reconcile}:9876543210 (account acct-1, pool strava-fetcher, delivery 2)"
    voicy = SimpleNamespace(name="voicy.download", args="('665f1c2e9b1e8a0012345678', '…')", kwargs="{}",
                            result=None)
    assert flowerconfig.format_task(voicy).args == voicy.args
    odd = SimpleNamespace(name="cairn.job", args="['fetch_source', {'job_id': 'x'}", kwargs="{}", result=None)
    assert flowerconfig.format_task(odd).args == odd.args  # not a literal: shown as it came
