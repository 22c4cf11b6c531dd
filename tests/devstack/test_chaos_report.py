"""The chaos harness's bookkeeping: how a Voicy job is counted from the dev server's records, what
counts as one Cairn execution, and the RELIABILITY.md writer.

The harness itself runs as ``make bench ARGS=chaos`` (minutes, the whole fleet);
these check the parts of it that decide the figures and keep the history, in
milliseconds, so a rerun on main cannot silently drop the earlier rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from bson import ObjectId

from bench import chaos_report
from bench.chaos import targets_met
from bench.chaos_count import _executions, count_voicy
from bench.chaos_rig import VoicyJob
from devstack.fakes.voicy_api import DevVoicyServer


def test_a_delivery_and_its_segment_companion_are_one_execution() -> None:
    assert _executions("j-1", {"result:j-1:d1", "result:j-1:d1:seg"}) == {":d1"}


def test_results_of_two_deliveries_are_two_executions() -> None:
    assert _executions("j-1", {"result:j-1:d1", "result:j-1:d2", "result:j-1:d2:seg"}) == {":d1", ":d2"}


def test_a_failure_envelope_without_a_delivery_tag_is_one_execution() -> None:
    assert _executions("j-1", {"result:j-1"}) == {""}


def _figures(**over: Any) -> dict[str, Any]:
    side = {"jobs": 2, "final": 2, "completed": 2, "failed": 0, "failed_reasons": {}, "lost": 0,
            "lost_of_which_inherent": 0, "stuck": 0, "duplicate_executions": 0, "retried": 0}
    figures = {"seed": 7, "command": "python -m bench chaos --seed 7", "commit": "main@abc1234", "window_s": 60.0,
               "kill_every_s": 6.0, "voicy_jobs": 2, "cairn_jobs": 2, "quiesce_bound_s": 300.0, "lost": 0,
               "duplicate_executions": 0, "failed": 0, "stuck": 0, "crashed_not_restarted": 0, "down_at_end": [],
               "self_exits": 1, "self_exit_detail": [{"dyno": "beat.1", "rc": 1}],
               "kills": 1, "kill_log": [{"t": 3.0, "target": "gpu.1 child", "pid": 1, "voicy_downloading": 0,
                                         "voicy_transcribing": 1, "cairn_in_flight": 0}],
               "infra": [{"t": 20.0, "what": "redis restart", "down_s": 3.0}], "restarts": 2,
               "voicy": side, "cairn": side, "quiet": True, "setup_s": 10.0, "warmup_s": 5.0,
               "quiescence_s": 8.0, "total_s": 80.0, "kept_workdir": None, "loadavg": [1.0, 1.0, 1.0]}
    return figures | over


def test_the_writer_keeps_earlier_runs_and_adds_this_one(tmp_path: Path) -> None:
    doc = tmp_path / "RELIABILITY.md"
    chaos_report.write_reliability(_figures(duplicate_executions=22, seed=1), doc)
    chaos_report.write_reliability(_figures(), doc)
    text = doc.read_text()
    rows = chaos_report._previous_rows(doc)
    assert len(rows) == 2
    assert "| 22 |" in rows[0] and "`python -m bench chaos --seed 7`" in rows[1]
    assert "transcription in flight: 1" in text and "beat.1 rc=1" in text


def test_the_summary_line_names_every_target() -> None:
    line = chaos_report.summary_line(_figures(lost=3))
    assert "\n" not in line
    for part in ("lost=3", "duplicate=0", "failed=0", "stuck=0", "crashed_not_restarted=0", "seed=7"):
        assert part in line


def test_targets_are_zero_lost_duplicate_stuck_and_crashed() -> None:
    assert targets_met(_figures(failed=4, self_exits=2))
    for figure in ("lost", "duplicate_executions", "stuck", "crashed_not_restarted"):
        assert not targets_met(_figures(**{figure: 1}))


@dataclass
class _Rig:
    """What ``count_voicy`` reads of a rig: the dev server and the measured jobs."""

    voicy_api: DevVoicyServer
    voicy: list[VoicyJob] = field(default_factory=list)


def _job(server: DevVoicyServer, name: str, **fields: Any) -> VoicyJob:
    job_id = server.enqueue_job(name, file_size=10, mime_type="audio/ogg")
    if fields:
        server.update_job(job_id, fields)
    return VoicyJob(job_id, name, 5.0)


def test_voicy_jobs_are_counted_final_stuck_lost_or_inherent() -> None:
    with DevVoicyServer() as server:
        now = server.state.now()
        rig = _Rig(server)
        rig.voicy = [
            _job(server, "done", status="completed"),
            _job(server, "failed", status="failed", lastError="attempts exhausted"),
            _job(server, "held", status="transcribing", claimedAt=now, heartbeatAt=now),
            _job(server, "dropped", status="transcribing", claimedAt=now - timedelta(minutes=5),
                 heartbeatAt=now - timedelta(minutes=5)),
            _job(server, "orphan", status="downloading", claimedAt=now - timedelta(minutes=2),
                 heartbeatAt=now - timedelta(minutes=2), workerId=str(ObjectId())),
        ]
        out = count_voicy(rig)  # type: ignore[arg-type]
    ids = {j.file_id: j.job_id for j in rig.voicy}
    assert (out.jobs, out.final, out.completed) == (5, 2, 1)
    assert dict(out.failed) == {"attempts exhausted": 1}
    assert out.stuck == [f"{ids['held']}:transcribing"]
    assert sorted(out.lost) == sorted([f"{ids['dropped']}:transcribing", f"{ids['orphan']}:downloading"])
    assert out.inherent == [ids["orphan"]]
    assert out.duplicates == []


def _partition_figures() -> dict[str, Any]:
    part = {"name": "gpu-link", "how": "gpu2: link down", "down_s": 15.0, "settle_s": 70.0, "healthy_s": 12.0,
            "lost": 0, "lost_of_which_inherent": 0, "duplicate": 0, "failed": 0, "stuck": 0,
            "ids": {"lost": [], "duplicate": [], "stuck": []}, "cut_host": "gpu2",
            "results_accepted_from": ["gpu1"], "cut_host_late_posts": [], "late_result_ok": True}
    return {"seed": 1, "partitions": [part], "setup_s": 30.0, "warmup_s": 20.0, "total_s": 150.0,
            "down_at_end": [], "self_exits": [], "health_checked": True, "met": True,
            "placement": {"gpu.1": "gpu1", "gpu.2": "gpu2"}, "command": "python -m bench partitions --only gpu-link",
            "commit": "main@def5678"}


def test_partition_runs_share_the_chaos_table_and_a_chaos_run_keeps_their_section(tmp_path: Path) -> None:
    from bench import partitions_report

    doc = tmp_path / "RELIABILITY.md"
    chaos_report.write_reliability(_figures(), doc)
    partitions_report.write(_partition_figures(), doc)
    chaos_report.write_reliability(_figures(seed=9), doc)
    text = doc.read_text()
    rows = chaos_report._previous_rows(doc)
    assert len(rows) == 3 and "`python -m bench partitions --only gpu-link`" in rows[1]
    assert "| gpu-link | gpu2: link down, 15 s | 0 | 0 | 0 | 0 | 12 s | 70 s | recovered by gpu1;" in text
    assert text.count(chaos_report.PARTS_BEGIN) == 1
