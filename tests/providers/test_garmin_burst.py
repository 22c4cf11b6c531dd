"""P1 for Garmin: one account's burst on two instances of the Procfile's ``garmin`` line: one login per instance.

Twenty ``fetch_source`` jobs, a reconcile whose sub-jobs land in the same burst, and a
Connect 429 that NAKs one delivery, all for one account, published together as a first
import delivers them, to two worker instances started with the Procfile's own command
line (``-P threads``: one process, one session cache per instance). The fake Garmin
counts the SSO logins: at most one per instance, none refused by the shared login
window, every activity ingested exactly once, and each instance's presence renewed
from inside the pool (tests/providers/test_garmin_logins.py proves the same rules in process).
"""

from __future__ import annotations

import os
import re
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devstack.fakes.cairn_core import DevCairnCore
from devstack.infra import cairn_stack, procfile
from devstack.infra.procs import Proc
from tests.kit.cairn_stack import WAIT_S
from tests.kit.garmin_stack import GARMIN, GarminStack
from tests.kit.waiting import wait_until
from workers.providers.kinds import FETCH_SOURCE, RECONCILE

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("garmin_burst")]

POOL = "garmin-fetcher"  # the name the Procfile's garmin lines give the pool
INSTANCES = 2
BURST = 20
RECONCILED = 4  # activities only the reconcile finds: its sub-jobs run inside the burst
READY_S = 90.0  # a loaded box: each instance imports the whole fleet at start
BURST_S = 120.0
LOGIN_LINE = "garmin login for account {}"
# The burst is 20 × 3 requests for one account: above the default 30 a minute, which would only
# delay it (a short-window NAK), not test the logins.
BURST_ENV = {"CAIRN_PROVIDER": GARMIN, "CAIRN_GARMIN_REQUESTS_PER_MINUTE": "200"}
MAX_IN_FLIGHT = "16"  # the bridge holds enough of the burst at once to keep both instances' threads busy


@dataclass
class BurstStack(GarminStack):
    @property
    def env(self) -> dict[str, str]:
        return {**super().env, "CAIRN_MAX_IN_FLIGHT": MAX_IN_FLIGHT}


@dataclass
class Fleet:
    stack: BurstStack
    workers: list[Proc] = field(default_factory=list)

    def logins_by_instance(self, account_id: str) -> list[int]:
        return [w.log().count(LOGIN_LINE.format(account_id)) for w in self.workers]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, redis_url: str, s3_endpoint: str) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("garmin-burst")
    stack = BurstStack(tmp, redis_url, s3_endpoint, pool=POOL, extra_env=dict(BURST_ENV))
    running = Fleet(stack)
    try:
        stack.start()
        stack.start_bridge()
        for n in range(INSTANCES):
            env = {**stack.env, "HONCHO_PROCESS_NAME": f"garmin.{n + 1}"}
            running.workers.append(procfile.run("garmin", env, Path(tmp) / f"garmin-{n + 1}.log"))
        for w in running.workers:
            def ready(w: Proc = w) -> bool:
                return " ready." in w.log() or w.proc.poll() is not None

            wait_until(ready, READY_S, "a garmin instance")
            assert w.proc.poll() is None, w.log()[-3000:]
        yield running
    finally:
        for n, w in enumerate(running.workers, start=1):  # what an instance costs (docs/BENCHMARKS.md)
            if w.proc.poll() is None:
                kib, procs = _rss_kib(w.proc.pid)
                print(f"garmin.{n}: {procs} process(es), RSS {kib // 1024} MiB at the end of the module")
            w.stop()
        stack.stop()


def _imported(core: DevCairnCore) -> Counter[str]:
    """How many times core ingested each activity (by external id), over every result."""
    seen: Counter[str] = Counter()
    for result in core.ingested:
        if result.kind == "events":
            seen.update(e["activity"]["ref"]["externalId"] for e in result.data["events"] if "activity" in e)
    return seen


def _rss_kib(pid: int) -> tuple[int, int]:
    """Resident memory (KiB) of every process in ``pid``'s group (an instance and its pool children), and how many."""
    total = count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) != pid:
                    continue
                status = Path(f"/proc/{entry}/status").read_text()
            except (OSError, ProcessLookupError):
                continue
            match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
            total += int(match[1]) if match else 0
            count += 1
    return total, count


def test_a_burst_for_one_account_logs_in_once_per_instance_and_imports_everything_once(fleet: Fleet) -> None:
    stack, core, garmin = fleet.stack, fleet.stack.core, fleet.stack.garmin
    assert core is not None and garmin is not None
    connected, account = stack.connect_garmin(n_activities=BURST + RECONCILED)
    acct = connected.account
    ids = [str(a.activity_id) for a in account.newest_first()]
    burst = ids[RECONCILED:]  # the newest RECONCILED only the reconcile finds
    garmin.fail("download", 429, retry_after_s=1)  # one delivery is NAKed and redelivered inside the burst
    for ext_id in burst:
        core.enqueue_job(FETCH_SOURCE, cairn_stack.CairnStack.fetch_job(acct, ext_id))
    reconcile = {"job_id": f"rec-{uuid.uuid4().hex[:8]}", "account_id": acct.account_id, "user_id": acct.user_id,
                 "provider": GARMIN, "max_enqueue": 500, "known_ext_ids": burst}
    core.enqueue_job(RECONCILE, reconcile)

    wait_until(lambda: set(_imported(core)) >= set(ids), BURST_S, "every activity of the burst imported")
    wait_until(lambda: any(r.msg_id == f"result:{reconcile['job_id']}" for r in core.ingested), WAIT_S,
               "the reconcile's result")
    imported = _imported(core)
    assert {ext_id: n for ext_id, n in imported.items() if ext_id in ids} == dict.fromkeys(ids, 1)
    assert garmin.logins(account.email) <= INSTANCES
    assert all(n <= 1 for n in fleet.logins_by_instance(acct.account_id)), fleet.logins_by_instance(acct.account_id)
    bridge_log = stack.bridge.log() if stack.bridge is not None else ""
    naks = [line for line in bridge_log.splitlines() if "nak fetch_source" in line]
    assert not [line for line in naks if "login" in line], naks  # the login window was never spent against itself
    assert any("rate_limited" in line for line in naks), naks  # the 429 was NAKed and its redelivery imported
    # OAuth2 exchanges: one per login (none per job, none per thread)
    assert garmin.calls("exchange", account.email) <= garmin.logins(account.email)
    for w in fleet.workers:
        assert "Traceback" not in w.log(), w.log()[-3000:]
    # C5 from inside the pool: each instance renews its own presence record
    wait_until(lambda: len(core.live_presence(POOL)) >= INSTANCES, WAIT_S, "both instances' presence")

