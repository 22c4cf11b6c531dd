"""Module docstrings of the runtime say their concept in a line or a few, and hold no history or figures."""

from __future__ import annotations

import ast
import re
import statistics

from tests.kit.layout import ROOT

RUNTIME_PACKAGES = ("workers", "tasks", "bridges", "ops")
GENERATED = ROOT / "workers" / "cairn" / "contract" / "pb"  # protoc's output (make proto)
MAX_MEDIAN_LINES = 5  # issue 21: the runtime's median module docstring
MAX_LINES = 5  # one line is the aim (kombu's style); the why goes on the object it explains
# A commit hash: 7-40 hex digits with at least one digit and one letter (so neither a word nor a number).
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
CPU_SECONDS = re.compile(r"\d+(?:\.\d+)? ?CPU-?s\b|CPU[- ]seconds?|s of CPU\b", re.IGNORECASE)

# Modules whose docstring breaks the rule for now; every runtime module is converted, so none may.
NOT_YET_CONVERTED: frozenset[str] = frozenset()


def module_docstrings() -> dict[str, str]:
    """Every runtime module's docstring by repository path (generated stubs and empty modules left out)."""
    docs = {}
    for package in RUNTIME_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.is_relative_to(GENERATED):
                continue
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=True)
            if doc:
                docs[path.relative_to(ROOT).as_posix()] = doc.strip()
    return docs


def problems(doc: str) -> list[str]:
    """What is wrong with one module docstring: too long, a commit hash, a CPU-second figure."""
    found = []
    lines = len(doc.splitlines())
    if lines > MAX_LINES:
        found.append(f"{lines} lines (at most {MAX_LINES}; move the why onto the objects)")
    if match := COMMIT_HASH.search(doc):
        found.append(f"commit hash {match.group()!r} (history belongs in commit messages)")
    if match := CPU_SECONDS.search(doc):
        found.append(f"CPU figure {match.group()!r} (figures belong in docs/BENCHMARKS.md)")
    return found


def test_runtime_median_module_docstring_is_short() -> None:
    docs = module_docstrings()
    median = statistics.median(len(doc.splitlines()) for doc in docs.values())
    assert median <= MAX_MEDIAN_LINES, f"median module docstring is {median} lines over {len(docs)} modules"


def test_no_new_module_docstring_is_long_or_holds_history() -> None:
    offenders = {path: found for path, doc in module_docstrings().items()
                 if path not in NOT_YET_CONVERTED and (found := problems(doc))}
    assert not offenders, f"module docstrings to shrink to one line: {offenders}"


def test_not_yet_converted_lists_only_offenders() -> None:
    docs = module_docstrings()
    done = sorted(path for path in NOT_YET_CONVERTED if not problems(docs.get(path, "")))
    assert not done, f"converted (or moved): drop them from NOT_YET_CONVERTED: {done}"


def test_the_rules_catch_what_they_name() -> None:
    assert problems("One line.") == []
    assert problems("Fixed in 03507ea.")[0].startswith("commit hash")
    assert problems("It cost 841 CPU-s.")[0].startswith("CPU figure")
    assert problems("0.3 s of CPU in every worker.")[0].startswith("CPU figure")
    assert problems("A deadbeef decade: 1234567 events, 60 s per CPU core.") == []
    assert problems("\n".join(["line"] * (MAX_LINES + 1)))[0].startswith(f"{MAX_LINES + 1} lines")
