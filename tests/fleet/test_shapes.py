"""What a release promises the one before it, in the fast tier: the release records agree, and job tasks
refuse argument shapes they cannot read with one line and a hand-back, never run them as something else."""

from __future__ import annotations

import logging
import re
import tomllib

import pytest

import tasks.cairn
import tasks.voicy
from tasks.shapes import SHAPE_KEY, ShapeRefused, read_cairn_job, read_voicy_job
from tests.kit.releases import ROOT, previous_release, releases
from workers.cairn.disposition import RELEASE_REFUSED_NAK_DELAY_S
from workers.cairn.handlers import run_admitted
from workers.cairn.handlers.context import Delivery
from workers.cairn.settings import WORKER_RELEASE

TOKEN = "lease-token-4f2a"  # a lease token is no secret, but never shown: not in a refusal's line either
META = {"stream": "CAIRN_JOBS", "seq": 7, "stamp": 1.0, "delivery": 1, "lease_token": TOKEN}


def test_the_changelog_names_this_release_and_the_commit_of_the_previous_one() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    top, *older = releases()
    assert top.version == version, "CHANGELOG.md's top entry is pyproject's version"
    assert WORKER_RELEASE == f"v{version}", "CAIRN_RELEASE's default is this release (contract §1)"
    assert previous_release() == next(r for r in older if r.commit)
    parsed = releases("## [1.1.0] - Unreleased\n\n## [1.0.0] - 2027-01-01\n\nCommit: `" + "a" * 40 + "`\n")
    assert [(r.version, r.commit) for r in parsed] == [("1.1.0", None), ("1.0.0", "a" * 40)]


def test_a_voicy_job_task_reads_its_shape_and_tolerates_a_later_releases_hints() -> None:
    assert read_voicy_job("voicy.download", ("job-1", TOKEN), {}).token == TOKEN
    assert read_voicy_job("voicy.download", ("job-1", TOKEN), {SHAPE_KEY: 1, "hint": "x"}).job_id == "job-1"


@pytest.mark.parametrize(("args", "kwargs", "why", "ids"), [
    (("job-1", TOKEN), {SHAPE_KEY: 2}, "argument shape 2 is not one this release reads (1)", ("job-1", TOKEN)),
    (("job-1", TOKEN, "extra"), {}, "arguments (str, str, str) are not (job id, lease token)", ("job-1", None)),
    ((17,), {}, "arguments (int) are not (job id, lease token)", (None, None)),
])
def test_a_voicy_job_task_of_another_shape_is_refused_naming_what_it_can(
        args: tuple, kwargs: dict, why: str, ids: tuple) -> None:
    with pytest.raises(ShapeRefused) as refused:
        read_voicy_job("voicy.transcribe", args, kwargs)
    assert str(refused.value) == f"voicy.transcribe: {why}" and TOKEN not in str(refused.value)
    assert (refused.value.job_id, refused.value.token if ids[1] else None) == ids


def test_a_voicy_task_whose_job_cannot_be_named_is_left_to_the_reapers_audit(
        caplog: pytest.LogCaptureFixture) -> None:
    """Nothing to hand back without a job id: one ERROR line, and the task ends without running."""
    with caplog.at_level(logging.ERROR, logger="tasks.voicy"):
        assert tasks.voicy.transcribe(17) is False
    (record,) = caplog.records
    assert "voicy.transcribe: arguments (int) are not (job id, lease token); not run" in record.getMessage()


@pytest.mark.parametrize(("args", "why"), [
    (("fetch_source", {}, {**META, SHAPE_KEY: 2}), "argument shape 2 is not one this release reads (1)"),
    (("fetch_source", {}), "arguments (str, dict) are not (kind, job, meta)"),
    (("fetch_source", {}, {"seq": 7}), "meta names no delivery, lease_token"),
])
def test_a_cairn_job_of_another_shape_is_handed_back_without_counting_as_a_failure(
        args: tuple, why: str, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ShapeRefused, match=re.escape(why)):
        read_cairn_job("cairn.job", args)
    with caplog.at_level(logging.WARNING):
        disposition = tasks.cairn.job(*args)  # refused before the runtime: no Redis, no NATS touched
    assert disposition["action"] == "nak" and disposition["counts_as_failure"] is False
    assert disposition["delay_s"] == RELEASE_REFUSED_NAK_DELAY_S
    (record,) = caplog.records
    assert f"cairn job refused: cairn.job: {why}" in record.getMessage() and TOKEN not in record.getMessage()
    assert read_cairn_job("cairn.job", ("fetch_source", {}, {**META, "later": 1})).meta["seq"] == 7


def test_a_job_kind_this_release_has_no_handler_for_waits_for_the_release_that_has_one() -> None:
    """A newer bridge's kind reaching an older worker: not termed (core would lose the job), NAKed."""
    disposition = run_admitted(None, "import_routes", {}, Delivery(1, 7, "cairn.jobs.import_routes.x.y",  # type: ignore[arg-type]
                                                                    lambda: False))
    assert disposition.action == "nak" and not disposition.counts_as_failure
    assert "job kind import_routes has no handler in this release" in disposition.reason
