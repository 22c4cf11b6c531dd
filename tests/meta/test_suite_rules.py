"""Rules for the test suite itself that a test can check (docs/TESTING.md lists the rest).

A test that sets up shared state the way production never would tests a different system, and under
xdist it also leaks that state into whichever test its worker runs next: a ``cairn_core`` bucket made
with nats-py's defaults (no direct get) turned every later presence test on the same session
nats-server into a ``STREAM.MSG.GET`` permission refusal, since core's worker template grants only
``$JS.API.DIRECT.GET`` (contract §1).
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# Core creates every KV bucket (devstack/fakes/cairn_core/bootstrap.py, as nats.go does: direct get on).
RAW_KV_CREATE = re.compile(r"\.create_key_value\(")


def test_kv_buckets_are_created_as_core_creates_them() -> None:
    offenders = [f"{path.relative_to(TESTS.parent)}:{n}" for path in sorted(TESTS.rglob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1) if RAW_KV_CREATE.search(line)]
    assert not offenders, ("create Cairn's KV buckets through tests.kit.cairn_ctx.core_bucket "
                           f"(core's own bootstrap), not js.create_key_value: {offenders}")
