"""A Procfile worker line stopped at an awkward moment stops cleanly: exit 0, no traceback.

honcho and the dyno manager stop a process whenever they please: while Celery starts, or while its
event loop is inside a Redis round trip. Each test runs the Procfile's own command line
(``tests/kit/procfile.py``) and stops it at one such moment.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from devstack.infra import services
from devstack.infra.procs import frozen
from tests.kit.cairn_stack import CairnStack
from tests.kit.procfile import ProcfileProcess, fleet_env
from tests.kit.waiting import wait_until

# H1: each test's processes end with an empty log budget (tests/conftest.py ``log_budget``).
pytestmark = pytest.mark.usefixtures("log_budget")


# ---------------------------------------------------------------------------- a stop while a worker starts
# A line of a worker's start-up output: the stop (SIGTERM to its group) goes out the moment it appears.
STARTUP_MOMENTS = {
    "banner": r"-------------- \S+@",  # Celery is about to install its handlers; the pool has not started
    "connected": r"Connected to ",  # the pool runs and the consumer starts: issue 14's traceback was here
    "ready": r" ready\.",  # the consumer's event loop is about to run
}
KILLED_BY_SIGTERM = -signal.SIGTERM  # before Celery's handlers are in, SIGTERM's default action ends it


@pytest.mark.slow
@pytest.mark.parametrize(("ptype", "moment"), [("gpu", m) for m in STARTUP_MOMENTS] + [("provider", "connected")])
def test_a_worker_stopped_while_it_starts_stops_cleanly(ptype: str, moment: str, tmp_path: Path, redis_url: str,
                                                         s3_endpoint: str,
                                                         launch: Callable[..., ProcfileProcess]) -> None:
    """``make demo``'s Ctrl-C once caught a worker starting on a loaded box: Celery's cold shutdown
    stopped the pool under the starting consumer, which died with ``Unrecoverable error:
    AttributeError(... 'did_start_ok')``, a traceback and exit 1 (tasks/hardening/startup_stop.py). A stop at any
    moment of the start-up is a clean one: exit 0, no traceback, an empty log budget, and no liveness
    record left to say the worker is up. Both sides configured, as the Procfile fleet runs."""
    import redis

    from tests.kit.voicy_stack import voicy_dev_stack
    from workers import liveness

    node_name = f"{ptype}.{uuid.uuid4().hex[:8]}"
    stack = CairnStack(tmp_path / "cairn", redis_url, s3_endpoint).start()
    try:
        with voicy_dev_stack(tmp_path, redis_url, "startup-stop") as (_server, _telegram, voicy_env):
            both = {k: v for k, v in {**voicy_env, **stack.env}.items() if k.startswith(("VOICY_", "CAIRN_"))}
            worker = launch(ptype, fleet_env(redis_url, HONCHO_PROCESS_NAME=node_name, **both))
            worker.wait_for_output(STARTUP_MOMENTS[moment])
            code = worker.stop()
    finally:
        stack.stop()
    output = worker.output()
    assert code in ((0, KILLED_BY_SIGTERM) if moment == "banner" else (0,)), output[-4000:]
    assert "Traceback" not in output and "CRITICAL" not in output, output[-4000:]
    client = redis.Redis.from_url(redis_url)
    try:
        assert not [r.name for r in liveness.read(client, liveness.WORKER) if r.name.startswith(f"{node_name}@")]
    finally:
        client.close()


# ---------------------------------------------------------------------------- a stop while the loop waits on Redis
# Where the kernel puts a thread that waits in poll(2): a socket with a timeout (redis-py's, kombu's) waits
# there; the worker's event loop waits in epoll instead. So a worker's main thread seen here is in one
# Redis round trip inside its event loop's turn (a timer's, such as the event heartbeat's), not between turns.
SOCKET_WAIT_WCHAN = "poll_schedule_timeout"
MAIN_THREAD_WAIT_TIMEOUT_S = 30.0  # the event heartbeat (every 2 s) sends within this


def waits_on_a_socket(pid: int) -> bool:
    return Path(f"/proc/{pid}/wchan").read_text().startswith(SOCKET_WAIT_WCHAN)


@pytest.mark.slow
def test_a_worker_stopped_mid_turn_of_its_event_loop_stops_cleanly(
        tmp_path: Path, launch: Callable[..., ProcfileProcess]) -> None:
    """Celery's cold shutdown stops the prefork pool inside the signal handler, which runs wherever the
    main thread is. Caught mid-turn of the event loop (in a timer's Redis round trip: likely on a loaded
    box, certain while Redis does not answer), the rest of that turn asked kombu's Redis poller whether the
    task channel may consume, and Celery's prefetch limit read the stopped pool: ``Unrecoverable error:
    AttributeError("'NoneType' object has no attribute '_processes'")``, a traceback and exit 1 (issue 14's
    full-suite run, the pools test's garmin worker). A worker told to stop consumes nothing more
    (tasks/hardening/stop_consuming.py): exit 0, no traceback, an empty log budget."""
    with services.redis_server() as own:  # its own Redis: the test freezes it
        assert own.proc is not None
        worker = launch("io", fleet_env(own.url, HONCHO_PROCESS_NAME=f"io.{uuid.uuid4().hex[:8]}"))
        worker.wait_for_output(r" ready\.")
        with frozen(own.proc.pid):  # on leaving: the pool's stop fires the loop's timers (on Redis)
            wait_until(lambda: waits_on_a_socket(worker.proc.pid), MAIN_THREAD_WAIT_TIMEOUT_S,
                       "the worker's main thread to wait on Redis inside its event loop's turn", interval_s=0.05)
            # As honcho and the dyno manager stop it. Its handler runs inside that round trip even once
            # Redis answers again: Python handles a signal at the main thread's next bytecode.
            os.killpg(worker.proc.pid, signal.SIGTERM)
        code = worker.wait_exit()
    output = worker.output()
    assert code == 0, output[-4000:]
    assert "Traceback" not in output and "CRITICAL" not in output, output[-4000:]


# ---------------------------------------------------------------------------- a pool child gone with the stop
def pool_children(pid: int) -> list[int]:
    return [child.pid for child in psutil.Process(pid).children()]


@pytest.mark.slow
def test_a_pool_child_gone_with_the_stop_before_the_loop_runs_fails_nothing(
        tmp_path: Path, launch: Callable[..., ProcfileProcess]) -> None:
    """A stop sent to the group while the worker starts reaches its pool children too, and one still
    initialising takes SIGTERM's default action. The moments above catch that only when the box is slow;
    here it is certain: the worker waits on its frozen Redis while it connects, its child is killed, then
    the stop comes. Celery's first check of the pool must not count the child as a failed start
    (``Unrecoverable error: WorkerLostError``, exit 1) nor log its end as an error."""
    with services.redis_server() as own:  # its own Redis: the test freezes it
        assert own.proc is not None
        with frozen(own.proc.pid):  # the consumer's first Redis round trip waits: the loop cannot run
            worker = launch("gpu", fleet_env(own.url, HONCHO_PROCESS_NAME=f"gpu.{uuid.uuid4().hex[:8]}"))
            wait_until(lambda: pool_children(worker.proc.pid) and waits_on_a_socket(worker.proc.pid),
                       MAIN_THREAD_WAIT_TIMEOUT_S, "the worker's pool to start and its main thread to wait on Redis",
                       interval_s=0.05)
            (child,) = pool_children(worker.proc.pid)
            os.kill(child, signal.SIGKILL)  # as SIGTERM's default action ends a child still initialising
            os.killpg(worker.proc.pid, signal.SIGTERM)
        code = worker.wait_exit()
    output = worker.output()
    assert "Cold shutdown while starting" in output, output[-4000:]
    assert code == 0, output[-4000:]
    assert "Traceback" not in output and "CRITICAL" not in output and "exited with" not in output, output[-4000:]
