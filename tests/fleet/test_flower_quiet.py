"""Flower shows the jobs, not the housekeeping (issue 11 §5).

Beat sends ``voicy.reap`` every second here (half a 2 s lease) and
``voicy.heartbeat`` every second; the io worker runs them. Short periods are
safe here: no job, so no lease that a loaded box could let expire. Flower builds its
task list from task events, so none may carry these tasks: no ``task-sent``
from beat, no ``task-received``/``started``/``succeeded`` from the worker. A
real task on the same worker still produces its events (the capture works).
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
import redis
from celery import Celery

from tests.kit.celery_worker import CeleryWorker
from tests.kit.procfile import start_procfile_beat
from tests.kit.task_events import TaskEvents
from tests.kit.voicy_stack import voicy_dev_stack
from tests.kit.waiting import wait_until

pytestmark = pytest.mark.slow  # starts fleet processes (tests/kit/fleet_guard.py)

REAPS_TO_SEE = 3
BURST = 20  # instant tasks sent at once
TASK_EVENT_TOPICS = "/*.celeryev/task.*"  # kombu's fanout channels of the task events
HOUSEKEEPING_EVERY_SECOND = {"VOICY_WORKER_LEASE_TTL_MS": "2000", "VOICY_WORKER_HEARTBEAT_INTERVAL_MS": "1000"}
WAIT_S = 60.0
_TASK_ID = r"Task {name}\[([0-9a-f-]+)\] received"


def test_beat_housekeeping_sends_no_task_events_but_real_tasks_do(tmp_path: Path, fresh_redis: str) -> None:
    with voicy_dev_stack(tmp_path, fresh_redis, "flower", **HOUSEKEEPING_EVERY_SECOND) as (_server, _telegram, env):
        io = CeleryWorker("io", env, tmp_path / "io.log")
        io.wait_ready(fresh_redis)
        beat = start_procfile_beat(env, tmp_path / "beat.log")
        probe = Celery("probe", broker=fresh_redis)
        try:
            with TaskEvents(fresh_redis) as events:
                wait_until(lambda: len(re.findall(_TASK_ID.format(name=r"voicy\.reap"), io.log())) >= REAPS_TO_SEE,
                           WAIT_S, "beat's reaps to run on the io worker")
                # a real task (its lease is not granted, so it ends at once) still shows in Flower
                real_id = str(uuid.uuid4())
                probe.send_task("voicy.download", args=[f"job-{real_id}", "no-such-grant"], task_id=real_id,
                                queue="io")
                wait_until(lambda: any(e.get("uuid") == real_id and e.get("type") in ("task-succeeded", "task-failed")
                                       for e in events.events), WAIT_S, "the real task's events")
                wait_until(lambda: re.search(_TASK_ID.format(name=r"voicy\.heartbeat"), io.log()), WAIT_S,
                           "a heartbeat task to run")
        finally:
            probe.close()
            beat.stop()
            io.stop()
    quiet = set(re.findall(_TASK_ID.format(name=r"voicy\.(?:reap|heartbeat)"), io.log()))
    assert len(quiet) >= REAPS_TO_SEE + 1
    seen = {e.get("uuid") for e in events.events if str(e.get("type", "")).startswith("task-")}
    assert real_id in seen
    assert not quiet & seen, "a housekeeping task reached the task events Flower lists"
    assert not [e for e in events.events if str(e.get("name", "")).startswith(("voicy.reap", "voicy.heartbeat"))]


def test_task_events_reach_flower_in_batches_and_none_is_lost(tmp_path: Path, fresh_redis: str) -> None:
    """Every task's received/started/succeeded events arrive, in far fewer messages than events: the
    consumer flushes them on a short timer (tasks/hardening/consumer.py), not one publish per event (issue 15 §3)."""
    with voicy_dev_stack(tmp_path, fresh_redis, "events") as (_server, _telegram, env):
        io = CeleryWorker("io", env, tmp_path / "io.log", concurrency=2)
        io.wait_ready(fresh_redis)
        probe = Celery("probe", broker=fresh_redis)
        raw = redis.Redis.from_url(fresh_redis).pubsub()
        raw.psubscribe(TASK_EVENT_TOPICS)
        try:
            with TaskEvents(fresh_redis) as events:
                ids = [str(uuid.uuid4()) for _ in range(BURST)]
                for task_id in ids:  # no grant: each task ends at once
                    probe.send_task("voicy.download", args=[f"job-{task_id}", "no-such-grant"], task_id=task_id,
                                    queue="io")
                wanted = {(t, kind) for t in ids for kind in ("task-received", "task-started", "task-succeeded")}
                wait_until(lambda: wanted <= {(e.get("uuid"), e.get("type")) for e in events.events}, WAIT_S,
                           "every task's three events")
            published = 0
            while (message := raw.get_message(timeout=1.0)) is not None:
                published += message["type"] == "pmessage"
        finally:
            raw.close()
            probe.close()
            io.stop()
    assert 0 < published <= BURST, f"{published} publishes for {len(wanted)} events"
