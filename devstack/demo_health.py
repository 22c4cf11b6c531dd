"""The demo's last word: the running fleet's health verdict and its log budget, in one ``HEALTH`` line."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from devstack.infra import log_budget
from devstack.infra.stack import ROOT

VERB_TIMEOUT_S = 120.0  # the verb bounds each network call itself; this bounds the process
FAIL_PREFIX = "FAIL "
UNHEALTHY_PREFIX = "UNHEALTHY: "  # ops.health.UNHEALTHY: parts failed (and maybe some were not checked)
UNVERIFIED_PREFIX = "UNVERIFIED: "  # ops.health.UNVERIFIED: none failed, but some part was not checked


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
    failing = parts_named(lines[-1] if lines else "")
    if run.returncode != 0 and not failing:
        failing = ["health verb"]  # it could not even say which part: a crash is unhealthy too
    return Verdict(lines, failing)


def parts_named(last: str) -> list[str]:
    """The parts the verdict's last line names: failed ones, then ``not checked: <part>`` ones."""
    if not last.startswith((UNHEALTHY_PREFIX, UNVERIFIED_PREFIX)):
        return []
    failed, _, unchecked = last.removeprefix(UNHEALTHY_PREFIX).removeprefix(UNVERIFIED_PREFIX) \
        .partition("not checked: ")
    return [p.strip() for p in failed.rstrip("; ").split(",") if p.strip()] + \
        [f"not checked: {p.strip()}" for p in unchecked.split(",") if p.strip()]


def show(verdict: Verdict) -> None:
    """Print the verdict while the fleet still runs (``--serve`` keeps it running after this)."""
    print("\n== health ==")
    for line in verdict.lines:
        print(f"  {line}", flush=True)


def report(verdict: Verdict, log_dir: Path) -> int:
    """After the stop: the log budget and the ``HEALTH`` line; 0 when the verdict and the budget are clean.

    The budget reads the logs of the stopped fleet (its stop is in them), so it comes last. Printed as
    ``HEALTH status=ok failing=[] log_budget=empty``, or naming what is wrong, ``status=unhealthy
    failing=[cairn presence] log_budget=1 unexplained``: a run that completed every job while a process
    warned every 20 s is not ``ok``.
    """
    budget = log_budget.scan([log_dir], log_budget.baseline())
    print(f"  {budget.report()}".replace("\n", "\n  "))
    healthy = verdict.healthy and budget.empty
    shown = "empty" if budget.empty else f"{len(budget.unexplained)} unexplained"
    print(f"HEALTH status={'ok' if healthy else 'unhealthy'} failing=[{', '.join(verdict.failing)}] "
          f"log_budget={shown}", flush=True)
    return 0 if healthy else 1
