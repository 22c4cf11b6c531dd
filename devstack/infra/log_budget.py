"""The log budget: a run that starts the fleet ends by reading every process's log (invariant H1).

Any WARNING, ERROR or CRITICAL record, and any traceback, that no allow-list
entry explains fails the run, naming the file, the line and the text. Why: a
fleet can finish every job while one process warns every 20 s that it cannot
do its duty (the presence write of issue 14); a summary that counts jobs says
``ok``, and only the log knows. An expected line is not silenced: it is
allowed *by name*, with the reason it is expected and the test (or run) that
provokes it, so a budget that grows is a reviewed change.

What is read, whatever wrote it:

* our human format (``workers.logs.HUMAN_FORMAT``): ``2026-01-02 10:00:00,123 WARNING name: text``;
* Celery's worker and beat format: ``[2026-01-02 10:00:00,123: WARNING/MainProcess] text``;
* Flower's (tornado's) format: ``[W 260102 10:00:00 module:98] text``;
* ``LOG_FORMAT=json``: one object per line with ``levelname``, ``message`` and, for an
  exception, ``exc_info``;
* anything else a process writes to its stderr: a bare ``Traceback (most recent call
  last):`` block, or a Python ``warnings`` line (``file.py:12: DeprecationWarning: ...``).

A record's continuation lines (a traceback under a logged error) belong to the
record: one finding, matched against the whole record's text.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LEVELS_OVER_BUDGET = ("WARNING", "ERROR", "CRITICAL")
TRACEBACK = "TRACEBACK"
_TORNADO_LEVELS = {"D": "DEBUG", "I": "INFO", "W": "WARNING", "E": "ERROR", "C": "CRITICAL"}
_HUMAN = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\S+: ")
_CELERY = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}: (DEBUG|INFO|WARNING|ERROR|CRITICAL)/[^\]]+\] ")
_TORNADO = re.compile(r"^\[([DIWEC]) \d{6} \d\d:\d\d:\d\d [^\]]+\] ")
_TRACEBACK_START = "Traceback (most recent call last):"
_PY_WARNING = re.compile(r"^\S+:\d+: \w*Warning: ")
_BARE_LEVEL = re.compile(r"^(WARNING|ERROR|CRITICAL)\b")
SHOWN_CHARS = 300  # a finding shows this much of its record


@dataclass(frozen=True)
class Allow:
    """One expected line: ``pattern`` (a regex searched in the record's text), why it is expected,
    and which test or run provokes it. ``logs`` limits it to log files whose name contains one of
    these; ``after`` allows it only after a line matching that regex in the same file (Flower's
    own shutdown, say)."""

    pattern: str
    reason: str
    provoked_by: str
    logs: tuple[str, ...] = ()
    after: str | None = None

    def __post_init__(self) -> None:
        if not (self.reason.strip() and self.provoked_by.strip()):
            raise ValueError(f"allow-list entry {self.pattern!r} needs a reason and the test that provokes it")
        re.compile(self.pattern)

    def explains(self, finding: Finding, started: bool) -> bool:
        if self.logs and not any(name in finding.path.name for name in self.logs):
            return False
        if self.after is not None and not started:
            return False
        return re.search(self.pattern, finding.text) is not None


@dataclass(frozen=True)
class Finding:
    """One record over budget: where it is, its level (or ``TRACEBACK``) and its text."""

    path: Path
    line_no: int
    level: str
    text: str

    def line(self) -> str:
        first = self.text.splitlines()[0] if self.text else ""
        shown = first if len(first) <= SHOWN_CHARS else first[:SHOWN_CHARS] + "…"
        last = self.text.rstrip().splitlines()[-1] if "\n" in self.text.rstrip() else ""
        tail = f" … {last.strip()[:SHOWN_CHARS]}" if last and last != first else ""
        return f"{self.path.name}:{self.line_no}: {shown}{tail}"


@dataclass
class Budget:
    """What a scan found: the unexplained findings, and how often each allow-list entry was used."""

    files: list[Path] = field(default_factory=list)
    unexplained: list[Finding] = field(default_factory=list)
    allowed: Counter[str] = field(default_factory=Counter)

    @property
    def empty(self) -> bool:
        return not self.unexplained

    def summary(self) -> str:
        """One line: ``empty`` or how many lines are over budget, and what was allowed."""
        allowed = sum(self.allowed.values())
        extra = f", {allowed} expected line(s) allowed" if allowed else ""
        if self.empty:
            return f"empty ({len(self.files)} logs{extra})"
        return f"{len(self.unexplained)} unexplained line(s) in {len(self.files)} logs{extra}"

    def report(self) -> str:
        """The summary and every unexplained line, one per line (what a failing run prints)."""
        return "\n".join([f"log budget: {self.summary()}", *(f"  {f.line()}" for f in self.unexplained)])


class LogBudgetExceeded(AssertionError):
    """A run's logs hold a WARNING, ERROR or traceback no allow-list entry explains."""


# --------------------------------------------------------------------------- reading
@dataclass
class _Record:
    line_no: int
    level: str | None  # None: a line with no recognised header (stray output)
    lines: list[str]
    traceback: bool = False

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def _json_record(line: str) -> tuple[str, str, bool] | None:
    """(level, text, has traceback) of a ``LOG_FORMAT=json`` line, None if it is not one."""
    if not line.startswith("{"):
        return None
    try:
        body = json.loads(line)
    except ValueError:
        return None
    if not isinstance(body, dict) or "levelname" not in body:
        return None
    exc = str(body.get("exc_info") or body.get("exc_text") or "")
    text = str(body.get("message", ""))
    return str(body["levelname"]).upper(), text + (f"\n{exc}" if exc else ""), bool(exc)


def _header_level(line: str) -> str | None:
    for pattern in (_HUMAN, _CELERY):
        match = pattern.match(line)
        if match:
            return match.group(1)
    match = _TORNADO.match(line)
    return _TORNADO_LEVELS[match.group(1)] if match else None


def _starts_something(line: str) -> bool:
    """A line that begins a finding of its own when no header precedes it (stray stderr output)."""
    return line.startswith(_TRACEBACK_START) or bool(_PY_WARNING.match(line) or _BARE_LEVEL.match(line))


def records(lines: Iterable[str]) -> list[_Record]:
    """Group a log's lines into records: a header line and the lines under it.

    A line with no header continues the logged record above it (a multi-line
    message, the traceback of a logged error), except a line that starts a
    warning, or a traceback under anything but a logged warning or error: that
    is stray output (a thread's uncaught exception on stderr), a record of its
    own reported at its own line, which takes its indented lines and, for a
    traceback, the exception line that ends it. So no record hides another's
    line from the allow-list. A JSON line is a whole record.
    """
    found: list[_Record] = []
    current: _Record | None = None
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\n")
        parsed = _json_record(line)
        if parsed is not None:
            level, text, has_tb = parsed
            found.append(_Record(number, level, [text], has_tb))
            current = None
            continue
        header = _header_level(line)
        if header is not None:
            current = _Record(number, header, [line])
            found.append(current)
            continue
        if current is not None and current.level is not None:
            # A logged error's traceback is its own; any other traceback or warning is stray output.
            logged_traceback = line.startswith(_TRACEBACK_START) and current.level in LEVELS_OVER_BUDGET
            if logged_traceback or not _starts_something(line):
                current.lines.append(line)
                current.traceback = current.traceback or line.startswith(_TRACEBACK_START)
                continue
        elif current is not None and (not line.strip() or line.startswith((" ", "\t", _TRACEBACK_START))):
            current.lines.append(line)  # a bare traceback's frames, a warning's source line
            continue
        elif current is not None and current.traceback:
            current.lines.append(line)  # the exception line ends a bare traceback
            current = None
            continue
        record = _Record(number, None, [line], traceback=line.startswith(_TRACEBACK_START))
        found.append(record)
        current = record if _starts_something(line) else None  # any other stray line stands alone
    return found


def _over_budget(record: _Record) -> str | None:
    """The finding's level, or None when the record is within budget."""
    if record.level in LEVELS_OVER_BUDGET:
        return record.level
    if record.traceback:
        return TRACEBACK
    if record.level is None and record.lines:
        first = record.lines[0]
        if _PY_WARNING.match(first) or _BARE_LEVEL.match(first):
            return "WARNING"
    return None


def scan_file(path: Path, allow: Sequence[Allow], budget: Budget) -> None:
    """Add ``path``'s findings to ``budget``."""
    budget.files.append(path)
    started: dict[int, bool] = {}
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for record in records(lines):
        level = _over_budget(record)
        if level is not None:
            finding = Finding(path, record.line_no, level, record.text)
            entry = next((e for i, e in enumerate(allow) if e.explains(finding, started.get(i, False))), None)
            if entry is None:
                budget.unexplained.append(finding)
            else:
                budget.allowed[entry.pattern] += 1
        for index, entry in enumerate(allow):  # a marker counts from the record after it
            if entry.after is not None and not started.get(index):
                started[index] = re.search(entry.after, record.text) is not None


def log_files(*places: Path) -> list[Path]:
    """Every ``*.log`` file under each place (a directory), or the place itself (a file)."""
    found: list[Path] = []
    for place in places:
        if place.is_dir():
            found += sorted(place.rglob("*.log"))
        elif place.exists():
            found.append(place)
    return found


def scan(places: Iterable[Path], allow: Sequence[Allow] = ()) -> Budget:
    """Read every log under ``places`` against the allow-list."""
    budget = Budget()
    for path in log_files(*places):
        scan_file(path, allow, budget)
    return budget


def check(places: Iterable[Path], allow: Sequence[Allow] = ()) -> Budget:
    """:func:`scan`, raising :class:`LogBudgetExceeded` (its report as the message) when over budget."""
    budget = scan(places, allow)
    if not budget.empty:
        raise LogBudgetExceeded(budget.report())
    return budget


# --------------------------------------------------------------------------- shared entries
# Lines that every fleet stop may print, each allowed only where it is harmless.
FLOWER_NO_REPLY = Allow(
    r"Inspect method \w+ failed$", logs=("web",),
    reason="Flower's inspect broadcast got no reply from any worker within its timeout: it inspects once as "
           "it starts, and a formation starts every process at once (workers still loading) and stops them "
           "at once; Flower lists workers from their events meanwhile. A failure with a cause (': <error>', "
           "a broker error) stays over budget",
    provoked_by="every start and stop of a whole formation with Flower: make demo (tests/fleet/test_demo.py)")
RUN_AS_ROOT = Allow(
    r"SecurityWarning: You're running the worker with superuser privileges",
    reason="Celery warns when a worker runs as root; this box and CI run everything as root (the host "
           "tests need ip netns), while a deployment runs its workers unprivileged (a Heroku dyno does)",
    provoked_by="every Celery worker started as root: make demo, the end-to-end tests, bench chaos")


def baseline() -> tuple[Allow, ...]:
    """What any run of the fleet may print: Flower's stop beside a whole formation, and, only where
    this process runs as root, Celery's warning about it. A worker's own stop prints no WARNING."""
    return (FLOWER_NO_REPLY,) + ((RUN_AS_ROOT,) if os.geteuid() == 0 else ())
