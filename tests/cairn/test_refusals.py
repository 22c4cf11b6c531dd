"""``Refusals``: how one connection turns nats-py's error callback into a permanent, once-reported failure.

The end-to-end proof runs the fleet against nats-server with core's template
(``tests/cairn/test_nats_permissions.py``); these pin the rules on the exact text
nats-py hands the error callback (lower-cased, ``nats.errors.Error``).
"""

from __future__ import annotations

import asyncio
import logging

import nats.errors
import pytest

from workers.cairn.refusals import PermissionRefused, Refusals, parse_refusal

SUBJECT = "$JS.API.CONSUMER.CREATE.CAIRN_JOBS.pool_fetch_source.cairn.jobs.fetch_source.strava.pool"


def _reported(subject: str, op: str = "publish") -> Exception:
    """What nats-py passes the error callback for ``-ERR 'Permissions Violation for Publish to "…"'``."""
    return nats.errors.Error(f'nats: permissions violation for {op} to "{subject.lower()}"')


def test_only_a_permissions_violation_is_a_refusal() -> None:
    refusal = parse_refusal(_reported("cairn.results.x", "subscription"))
    assert refusal is not None and (refusal.op, refusal.subject) == ("subscription", "cairn.results.x")
    assert parse_refusal(nats.errors.Error("nats: 'Authorization Violation'")) is None
    assert parse_refusal(TimeoutError()) is None


def test_each_subject_is_logged_once_recorded_once_and_forgotten_on_reconnect(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    recorded: list[tuple[str, str]] = []
    refusals = Refusals("cairn-pool/p", record=lambda c, d: recorded.append((c, d)))
    for _ in range(3):
        assert refusals.note(_reported("cairn.results.fetch_source.strava.p"))
    assert not refusals.note(nats.errors.Error("nats: slow consumer"))
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and 'publish to "cairn.results.fetch_source.strava.p"' in errors[0].getMessage()
    assert [c for c, _ in recorded] == ["cairn-pool/p"]
    assert refusals.refused("CAIRN.RESULTS.FETCH_SOURCE.STRAVA.P") is not None
    refusals.clear()
    assert refusals.refused("cairn.results.fetch_source.strava.p") is None
    refusals.note(_reported("cairn.results.fetch_source.strava.p"))
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 2  # learned again


def test_a_guarded_operation_fails_at_once_as_permanent_and_a_claim_reports_it_itself(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    refusals = Refusals("cairn-bridge/p")

    async def scenario() -> tuple[PermissionRefused, str]:
        never = asyncio.get_running_loop().create_future()  # a refused request never gets its reply
        task = asyncio.create_task(refusals.guard(never, SUBJECT, claim=True))
        await asyncio.sleep(0)
        refusals.note(_reported(SUBJECT))
        with pytest.raises(PermissionRefused) as raised:
            await asyncio.wait_for(task, 1.0)
        untouched = await refusals.guard(asyncio.sleep(0, "answered"), "another.subject")
        return raised.value, untouched

    exc, untouched = asyncio.run(scenario())
    assert untouched == "answered"
    assert exc.refusal.subject == SUBJECT  # our spelling, not nats-py's lower case
    assert exc.code == "permission_refused" and not exc.retryable
    assert not [r for r in caplog.records if r.levelno == logging.ERROR]  # claimed: the caller says it
