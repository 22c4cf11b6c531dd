"""A worker host cut off silently (every packet dropped, no RST, its link up) works again soon after the heal (D1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.heals import measure
from tasks.hardening.reconnect import RECONNECT_INTERVAL_MAX_S
from workers.dead_peers import CONNECT_TIMEOUT_S, HEAL_BOUND_S, TCP_USER_TIMEOUT_S

pytestmark = pytest.mark.slow

# Longer than TCP_USER_TIMEOUT_S: a connection that was sending when the cut began is aborted during
# it, so the worker may have to come back through a reconnect.
CUT_S = TCP_USER_TIMEOUT_S + 2.0


def test_a_gpu_host_cut_off_silently_runs_a_task_again_within_the_bound_after_the_heal(tmp_path: Path) -> None:
    """The Procfile's gpu line on a host of its own, Redis (broker and results) on another; the
    worker's host is cut off silently for ``CUT_S``, with a task sent into the cut; from the heal on,
    a task is sent every half second until one comes back through the worker and the result backend."""
    heal = measure(tmp_path, "gpu", CUT_S)
    log = (tmp_path / "gpu.log").read_text(errors="replace")
    assert heal.works_again_after_s is not None, log[-3000:]
    assert heal.works_again_after_s <= HEAL_BOUND_S, (heal, log[-3000:])
    assert "Traceback" not in log, log[-3000:]


def test_a_worker_tries_its_broker_again_within_the_bound_however_long_the_cut() -> None:
    """The reconnect's longest wait plus one connect try stays inside the bound, however long the broker
    was away (tests/fleet/test_redis_restart.py sees a worker's waits capped through a minute's outage)."""
    assert RECONNECT_INTERVAL_MAX_S + CONNECT_TIMEOUT_S < HEAL_BOUND_S
