"""The demo's last word: the running fleet's health verdict and its log budget, in one ``HEALTH`` line.

Hooked into ``devstack/demo.py`` at two points. While the fleet still runs,
:func:`check_fleet` runs ``switchyard health`` (``python -m ops health``) with
the fleet's own environment, as an operator would. After the fleet and the
stack have stopped, :func:`report` reads every process's log against the log
budget (``devstack.infra.log_budget``; a plain demo expects no WARNING, ERROR
or traceback beyond the fleet's own stop) and prints::

    HEALTH status=ok failing=[] log_budget=empty

or, naming what is wrong, ``status=unhealthy failing=[cairn presence]
log_budget=1 unexplained``, each failing part and each unexplained line
printed above it. The demo's exit status is non-zero when unhealthy: a run
that completed every job while a process warned every 20 s is not ``ok``.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from devstack.infra import log_budget
from devstack.infra.stack import ROOT

VERB_TIMEOUT_S = 120.0  # the verb bounds each network call itself; this bounds the process
FAIL_PREFIX = "FAIL "
UNHEALTHY_PREFIX = "UNHEALTHY: "


@dataclass(frozen=True)
class Verdict:
    """What ``switchyard health`` printed, and the parts it failed."""

    lines: list[str]
    failing: list[str]

    @property
    def healthy(self) -> bool:
        return not self.failing


def check_fleet(env: dict[str, str]) -> Verdict:
    """Run ``switchyard health`` against the running fleet, with the fleet's environment."""
    try:
        run = subprocess.run([sys.executable, "-m", "ops", "health"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=VERB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Verdict([f"switchyard health did not answer within {VERB_TIMEOUT_S:.0f}s"], ["health verb"])
    lines = (run.stdout + run.stderr).splitlines()
    last = lines[-1] if lines else ""
    failing = [p.strip() for p in last.removeprefix(UNHEALTHY_PREFIX).split(",")] \
        if last.startswith(UNHEALTHY_PREFIX) else []
    if run.returncode != 0 and not failing:
        failing = ["health verb"]  # it could not even say which part: a crash is unhealthy too
    return Verdict(lines, failing)


def report(verdict: Verdict, log_dir: Path) -> int:
    """Print the verdict, the log budget and the ``HEALTH`` line; 0 when both are clean."""
    print("\n== health ==")
    for line in verdict.lines:
        print(f"  {line}")
    budget = log_budget.scan([log_dir], log_budget.baseline())
    print(f"  {budget.report()}".replace("\n", "\n  "))
    healthy = verdict.healthy and budget.empty
    shown = "empty" if budget.empty else f"{len(budget.unexplained)} unexplained"
    print(f"HEALTH status={'ok' if healthy else 'unhealthy'} failing=[{', '.join(verdict.failing)}] "
          f"log_budget={shown}", flush=True)
    return 0 if healthy else 1
