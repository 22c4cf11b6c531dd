"""The log budget (H1): every WARNING, ERROR and traceback of a run is explained by name, or the run fails.

Read from log files as the fleet writes them, in each format it writes: our
human format, Celery's, Flower's (tornado's), ``LOG_FORMAT=json`` and stray
stderr output. The presence bug of issue 14 (``presence write failed
(AttributeError)`` every 20 s from a provider worker with webhooks on) is the
line the budget exists for: it must be flagged, and no entry allows it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devstack.infra import log_budget
from devstack.infra.log_budget import Allow, LogBudgetExceeded

PRESENCE_BUG = ("[2026-12-03 14:05:08,466: WARNING/MainProcess] presence write failed (AttributeError); "
                "retrying every 20s")
CELERY_INFO = "[2026-12-03 14:05:07,562: INFO/MainProcess] beat: Starting..."
HUMAN_INFO = "2026-12-03 14:05:06,851 INFO    bridges.voicy: voicy bridge started (backlog limit 2)"
HUMAN_WARNING = ("2026-12-03 14:05:17,387 WARNING workers.outage: NATS unavailable (disconnected; reconnecting: "
                 "unreachable); retrying with backoff until it is back")
HUMAN_ERROR_WITH_TRACEBACK = [
    "2026-12-03 14:05:09,000 ERROR   bridges.cairn.holder: fetch_source seq 3 failed in the bridge: boom",
    "Traceback (most recent call last):",
    '  File "/app/bridges/cairn/holder.py", line 10, in own',
    "    raise ValueError('boom')",
    "ValueError: boom",
]
TORNADO_INFO = "[I 261203 14:05:07 command:177] Visit me at http://127.0.0.1:5555"
TORNADO_SHUTDOWN = "[I 261203 14:05:15 command:26] 15 detected, shutting down"
TORNADO_INSPECT = "[W 261203 14:05:17 inspector:98] Inspect method stats failed"
EVERY_PROCESS_STOPS = "the fleet's stop (a test of this module)"
REQUEUE = "[2026-12-03 14:21:39,928: WARNING/MainProcess] Requeuing undeliverable message for queue 'io': No consumers."


def write(tmp_path: Path, name: str, *lines: str) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_the_presence_bug_line_is_over_budget_and_named(tmp_path: Path) -> None:
    write(tmp_path, "provider.log", CELERY_INFO, PRESENCE_BUG, CELERY_INFO)
    with pytest.raises(LogBudgetExceeded) as failed:
        log_budget.check([tmp_path], log_budget.baseline())
    report = str(failed.value)
    assert "1 unexplained line(s)" in report
    assert "provider.log:2: " in report and "presence write failed (AttributeError)" in report


def test_no_entry_of_the_baseline_allows_the_presence_bug(tmp_path: Path) -> None:
    write(tmp_path, "provider.log", PRESENCE_BUG)
    budget = log_budget.scan([tmp_path], log_budget.baseline())
    assert [f.line_no for f in budget.unexplained] == [1] and not budget.allowed


def test_info_lines_of_every_format_are_within_budget(tmp_path: Path) -> None:
    json_info = json.dumps({"asctime": "2026-12-03", "levelname": "INFO", "name": "bridges", "message": "started"})
    write(tmp_path, "all.log", CELERY_INFO, HUMAN_INFO, TORNADO_INFO, json_info, "celery banner line",
          " -------------- provider.1@host v5.7.0", "")
    budget = log_budget.check([tmp_path])
    assert budget.empty and budget.summary() == "empty (1 logs)"


def test_each_format_reports_its_warnings_and_errors_at_their_line(tmp_path: Path) -> None:
    json_warning = json.dumps({"levelname": "WARNING", "name": "bridges.cairn", "message": "Redis unavailable"})
    write(tmp_path, "human.log", HUMAN_INFO, HUMAN_WARNING, *HUMAN_ERROR_WITH_TRACEBACK, HUMAN_INFO)
    write(tmp_path, "web.log", TORNADO_INFO, TORNADO_INSPECT)
    write(tmp_path, "json.log", json_warning)
    found = {(f.path.name, f.line_no, f.level) for f in log_budget.scan([tmp_path]).unexplained}
    assert found == {("human.log", 2, "WARNING"), ("human.log", 3, "ERROR"), ("web.log", 2, "WARNING"),
                     ("json.log", 1, "WARNING")}


def test_a_logged_exception_is_one_finding_with_its_traceback(tmp_path: Path) -> None:
    write(tmp_path, "bridge.log", *HUMAN_ERROR_WITH_TRACEBACK, HUMAN_INFO)
    (finding,) = log_budget.scan([tmp_path]).unexplained
    assert finding.text.endswith("ValueError: boom")
    assert finding.line() == f"bridge.log:1: {HUMAN_ERROR_WITH_TRACEBACK[0]} … ValueError: boom"


def test_a_json_exception_is_a_traceback_whatever_its_level(tmp_path: Path) -> None:
    record = {"levelname": "INFO", "name": "x", "message": "odd", "exc_info": "Traceback (most recent call "
              "last):\n  File \"x.py\", line 1\nKeyError: 'a'"}
    write(tmp_path, "json.log", json.dumps(record))
    (finding,) = log_budget.scan([tmp_path]).unexplained
    assert finding.level == log_budget.TRACEBACK and "KeyError" in finding.text


def test_stray_tracebacks_and_python_warnings_on_stderr_are_over_budget(tmp_path: Path) -> None:
    write(tmp_path, "worker.log", CELERY_INFO, "Exception in thread presence:", "Traceback (most recent call last):",
          '  File "t.py", line 3, in run', "RuntimeError: thread died", "plain output",
          "/venv/celery/platforms.py:893: SecurityWarning: running as root", "  warnings.warn(...)",
          "banner after the warning")
    findings = log_budget.scan([tmp_path]).unexplained
    assert [(f.line_no, f.level) for f in findings] == [(3, log_budget.TRACEBACK), (7, "WARNING")]
    assert findings[0].text.splitlines()[-1] == "RuntimeError: thread died"
    assert findings[1].text.splitlines() == ["/venv/celery/platforms.py:893: SecurityWarning: running as root",
                                             "  warnings.warn(...)"]


def test_an_entry_explains_its_lines_only_where_it_applies(tmp_path: Path) -> None:
    write(tmp_path, "cairn_bridge.log", HUMAN_WARNING)
    write(tmp_path, "voicy_bridge.log", HUMAN_WARNING)
    entry = Allow(r"NATS unavailable \(disconnected", reason="NATS is restarted on purpose",
                  provoked_by="test_x", logs=("cairn_bridge",))
    budget = log_budget.scan([tmp_path], [entry])
    assert [f.path.name for f in budget.unexplained] == ["voicy_bridge.log"]
    assert budget.allowed == {entry.pattern: 1}
    assert "1 expected line(s) allowed" in budget.summary()


AFTER_STOP = Allow(r"Requeuing undeliverable message", after=r"worker: (Cold|Warm) shutdown",
                   reason="a line expected only once the worker stops", provoked_by="this module's own lines")


def test_an_after_entry_allows_a_line_only_after_its_marker(tmp_path: Path) -> None:
    write(tmp_path, "io.log", CELERY_INFO, REQUEUE, "worker: Cold shutdown (MainProcess)", REQUEUE)
    budget = log_budget.scan([tmp_path], [AFTER_STOP])
    assert [f.line_no for f in budget.unexplained] == [2]  # before the worker's own shutdown: a real problem
    assert sum(budget.allowed.values()) == 1


def test_kombus_requeue_warning_at_a_workers_stop_is_over_budget(tmp_path: Path) -> None:
    """A stopping worker hands a last popped message back quietly (tasks/hardening/last_pop.py): kombu's
    requeue WARNING after the stop is a finding, not an expected line."""
    write(tmp_path, "io.log", CELERY_INFO, "worker: Cold shutdown (MainProcess)", REQUEUE)
    assert [f.line_no for f in log_budget.scan([tmp_path], log_budget.baseline()).unexplained] == [3]


def test_flowers_inspect_without_a_reply_is_allowed_but_not_with_an_error(tmp_path: Path) -> None:
    write(tmp_path, "web.log", TORNADO_INFO, TORNADO_INSPECT, TORNADO_SHUTDOWN,
          "[W 261203 14:05:17 inspector:95] Inspect method stats failed: Error 111 connecting to 127.0.0.1:6379.")
    budget = log_budget.scan([tmp_path], log_budget.baseline())
    assert [f.line_no for f in budget.unexplained] == [4]
    write(tmp_path, "web.log", TORNADO_INSPECT)
    write(tmp_path, "voicy_bridge.log", "[W 261203 14:05:17 inspector:98] Inspect method stats failed")
    assert [f.path.name for f in log_budget.scan([tmp_path], log_budget.baseline()).unexplained] == \
        ["voicy_bridge.log"]  # only Flower's own log


def test_an_entry_needs_its_reason_and_the_test_that_provokes_it() -> None:
    with pytest.raises(ValueError, match="reason"):
        Allow(r"x", reason="", provoked_by="test_x")
    with pytest.raises(ValueError, match="reason"):
        Allow(r"x", reason="why", provoked_by=" ")
    assert Allow(r"x", reason="why", provoked_by=EVERY_PROCESS_STOPS).provoked_by


def test_every_log_under_a_directory_is_read(tmp_path: Path) -> None:
    write(tmp_path, "a.log", HUMAN_INFO)
    (tmp_path / "nested").mkdir()
    write(tmp_path / "nested", "b.log", HUMAN_WARNING)
    write(tmp_path, "notes.txt", HUMAN_WARNING)  # not a log
    budget = log_budget.scan([tmp_path])
    assert sorted(p.name for p in budget.files) == ["a.log", "b.log"]
    assert [f.path.name for f in budget.unexplained] == ["b.log"]


def test_a_stray_warning_under_a_logged_warning_is_its_own_finding(tmp_path: Path) -> None:
    """Found in a real io worker's log: kombu's requeue warning, then Celery's root warning on stderr.
    Read as one record, the root warning's allowance would have explained the requeue too."""
    write(tmp_path, "io.log", REQUEUE,
          "/venv/celery/platforms.py:893: SecurityWarning: You're running the worker with superuser privileges: "
          "this is",
          "absolutely not recommended!")
    budget = log_budget.scan([tmp_path], [log_budget.RUN_AS_ROOT])
    assert [f.line_no for f in budget.unexplained] == [1]  # no "worker: Cold shutdown" before it: not allowed
    assert budget.allowed == {log_budget.RUN_AS_ROOT.pattern: 1}


def test_a_chaos_run_allows_its_outage_lines_but_not_a_bug(tmp_path: Path) -> None:
    """``python -m bench chaos`` restarts Redis and NATS and SIGKILLs processes: those lines are explained by
    its faults; the presence write failing with AttributeError is not a NATS outage, and misses the targets."""
    from bench import chaos_budget
    from bench.chaos import targets_met

    write(tmp_path, "provider.1.log",
          "[2026-12-03 14:42:37,667: WARNING/MainProcess] NATS unavailable (connection: UnexpectedEOF); retrying "
          "with backoff until it is back",
          "[2026-12-03 14:42:38,000: WARNING/MainProcess] presence write failed (TimeoutError); retrying every 20s",
          PRESENCE_BUG.replace("14:05:08", "14:43:00"),
          "[2026-12-03 14:42:46,228: ERROR/MainProcess] Process 'ForkPoolWorker-1' pid:18830 exited with "
          "'signal 9 (SIGKILL)'")
    budget = chaos_budget.scan([tmp_path / "provider.1.log"])
    assert [f.line_no for f in budget.unexplained] == [3]
    figures: dict[str, Any] = {"lost": 0, "duplicate_executions": 0, "stuck": 0, "crashed_not_restarted": 0,
               "log_budget": chaos_budget.figures(budget)}
    assert figures["log_budget"]["unexplained"] == 1 and not targets_met(figures)
    assert "presence write failed (AttributeError)" in figures["log_budget"]["lines"][0]
