"""``make demo`` in its short mode: the embedded stack and the whole Procfile fleet, end to end, and Ctrl-C."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from devstack import demo
from devstack.demo import activity_payloads, bar
from devstack.infra import procfile
from devstack.infra.cairn_stack import FAKE_KITS
from devstack.infra.nats_auth import Pool

ROOT = Path(__file__).resolve().parents[2]
DEMO_TIMEOUT_S = 420

# One xdist worker runs the demos: each binds Flower to the fixed demo port 5555.
pytestmark = [pytest.mark.xdist_group("demo")]


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow
@pytest.mark.skipif(not _port_free(5555), reason="Flower's demo port 5555 is in use on this machine")
def test_demo_short_mode_completes_both_sides_and_serves_with_its_verdict_shown() -> None:
    """``--serve``: the verdict is printed while the fleet still runs, before it waits for Ctrl-C; the
    ``HEALTH`` line (which needs the stopped fleet's logs) follows the Ctrl-C."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOICY_", "CAIRN_", "AWS_"))}
    proc = subprocess.Popen([sys.executable, "-m", "devstack.demo", "--short", "--serve", "--timeout", "300"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=_sigint_default)
    assert proc.stdout is not None
    served: list[str] = []
    for row in proc.stdout:
        served.append(row)
        if row.startswith("serving; press Ctrl-C"):
            break
    else:
        proc.wait(DEMO_TIMEOUT_S)
        pytest.fail("the demo ended without serving:\n" + "".join(served)[-4000:])
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=DEMO_TIMEOUT_S)
    out = "".join(served) + rest
    assert proc.returncode == 0, out[-4000:]
    before_serving = "".join(served).splitlines()
    assert "== health ==" in before_serving and "  HEALTHY: " in "\n".join(before_serving), out[-4000:]
    summary = [line for line in out.splitlines() if line.startswith("SUMMARY ")]
    assert summary == ["SUMMARY voicy_completed=3/3 strava_activities=5/5 garmin_activities=2/2 "
                       "cairn_rejected=0 status=ok"], out[-4000:]
    # H1: the running fleet's verdict, then every process's log read after the stop (a plain demo expects
    # nothing beyond the fleet's own stop; the presence bug of issue 14 made this line unhealthy)
    health = [line for line in out.splitlines() if line.startswith("HEALTH ")]
    assert health == ["HEALTH status=ok failing=[] log_budget=empty"], out[-4000:]
    assert "Flower: http://127.0.0.1:5555" in out
    assert "== transcripts ==" in out and "market" in out.lower()
    assert "ACTIVITY_TYPE_" in out
    assert "== imported activities of pool garmin-fetcher (garmin), by start time ==" in out
    # both pools side by side, each with its own presence and its own imports
    assert "pools: strava-fetcher (strava): 1 live, 5 activities | garmin-fetcher (garmin): 1 live, 2 activities" \
        in out.splitlines(), out[-4000:]


# A job neither queued nor final: Ctrl-C then interrupts real work (a "completed" row may be the last one).
STATE_IN_FLIGHT = re.compile(r"\] \d\d:\d\d/\d\d:\d\d (downloading|ready|transcribing)\b")
STOP_ORDER = ["stopping the fleet", "stopping the Cairn stack (the fakes, the dev Cairn core, NATS)",
              "stopping fake Telegram", "stopping the dev Voicy API", "stopping S3", "stopping Redis"]
FLEET_LOGS = re.compile(r"its logs, one per process: (\S+)")
POOLS = ("gpu", "io", "provider", "garmin")  # every Celery worker line of the Procfile


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _pools_ready(log_dir: Path) -> bool:
    """Every Celery pool of the fleet logged Celery's ready line."""
    logs = [log_dir / f"{pool}.log" for pool in POOLS]
    return all(log.is_file() and " ready." in log.read_text(errors="replace") for log in logs)


def _listening(url: str) -> bool:
    host, _, port = url.split("//", 1)[1].split("/", 1)[0].partition(":")
    with socket.socket() as sock:
        return sock.connect_ex((host, int(port))) == 0


@pytest.mark.slow
@pytest.mark.skipif(not _port_free(5555), reason="Flower's demo port 5555 is in use on this machine")
def test_ctrl_c_stops_the_fleet_first_then_nats_and_redis_without_a_traceback() -> None:
    """Ctrl-C as a terminal sends it (SIGINT to the demo's whole process group) while jobs are in flight:
    every fleet process exits on its SIGTERM, then the Cairn stack (fakes, core, NATS), the Voicy fakes, then S3
    and Redis last."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOICY_", "CAIRN_", "AWS_"))}
    # SIGINT back to its default in the demo: a run started in the background (nohup, `cmd &` in a
    # script) inherits it ignored, and Python then installs no KeyboardInterrupt handler at all.
    proc = subprocess.Popen([sys.executable, "-m", "devstack.demo", "--short", "--timeout", "300"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=_sigint_default)
    seen: list[str] = []
    fleet_logs: Path | None = None
    assert proc.stdout is not None
    for row in proc.stdout:
        seen.append(row)
        if row.startswith("SUMMARY"):
            proc.communicate(timeout=DEMO_TIMEOUT_S)
            pytest.fail("the run ended before the test saw a job in flight:\n" + "".join(seen))
        if (logs := FLEET_LOGS.search(row)) is not None:
            fleet_logs = Path(logs[1])
        # In flight, and every Celery pool up: a worker still starting when Ctrl-C comes is another test.
        if STATE_IN_FLIGHT.search(row) and fleet_logs is not None and _pools_ready(fleet_logs):
            break
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=DEMO_TIMEOUT_S)
    out = "".join(seen) + rest
    assert proc.returncode == 130, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    assert [row for row in out.splitlines() if row.startswith("stopping ")] == STOP_ORDER, out[-4000:]
    assert "every process exited on SIGTERM" in out, out[-4000:]
    [stack] = [row for row in out.splitlines() if row.startswith("stack: ")]
    redis_url, nats_url = re.findall(r"(?:Redis|NATS) (\S+?),", stack)
    assert not _listening(redis_url) and not _listening(nats_url)
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("the fleet's logs are kept in "), out[-4000:]
    log_dir = Path(last.removeprefix("the fleet's logs are kept in "))
    try:
        assert sorted(log.stem for log in log_dir.glob("*.log")) == sorted(procfile.runnable(procfile.entries())[0])
        for log in log_dir.glob("*.log"):
            assert "Traceback" not in log.read_text(errors="replace"), log.name
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


@pytest.mark.slow
def test_help_reads_as_help() -> None:
    out = subprocess.run([sys.executable, "-m", "devstack.demo", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--timeout SECONDS" in out.stdout and "after this many seconds" in out.stdout
    assert "\n\nCtrl-C stops the fleet first" in out.stdout  # paragraphs kept, not one flattened block
    assert "``" not in out.stdout  # no docstring markup


def test_bars_fill_from_the_streamed_parts_and_activities_come_in_date_order() -> None:
    streaming = {"status": "transcribing", "partialResultParts": [{"timeCode": "00:00", "text": "a"},
                                                                  {"timeCode": "01:02", "text": "b"}]}
    assert bar("long", streaming, 124.0) == f"  long     [{'#' * 15}{'.' * 15}] 01:02/02:04 transcribing, 2 parts"
    assert "[" + "." * 30 + "]" in bar("long", {"status": "ready"}, 124.0)
    done = {"status": "completed", "resultParts": [{"timeCode": "01:50", "text": "c"}]}
    assert "[" + "#" * 30 + "] 02:04/02:04 completed" in bar("long", done, 124.0)

    class Result:
        def __init__(self, *starts: str) -> None:
            self.data = {"events": [{"activity": {"payload": {"startTime": s}}} for s in starts]}

    payloads = activity_payloads([Result("2026-12-03T08:00:00Z"),
                                  Result("2026-11-29T16:00:00Z", "2026-12-01T12:00:00Z")])
    assert [p["startTime"] for p in payloads] == ["2026-11-29T16:00:00Z", "2026-12-01T12:00:00Z",
                                                  "2026-12-03T08:00:00Z"]


def test_the_demo_shows_the_procfiles_pools_and_names_none_itself(tmp_path: Path) -> None:
    """One list: the pools are the Procfile's bridge lines, each served by its provider's fake kit; the demo's
    code names no pool and no provider, so a third pool is Procfile lines (and a kit), never a demo edit."""
    bridge_lines = [cmd for cmd in procfile.runnable(procfile.entries())[0].values() if "-m bridges cairn" in cmd]
    pools = demo.Demo(True, tmp_path, tmp_path).pools
    assert pools == procfile.pools(procfile.runnable(procfile.entries())[0])
    assert len(pools) == len(bridge_lines) >= 2 and len({p.worker_name for p in pools}) == len(pools)
    assert all(p.provider in FAKE_KITS for p in pools)
    source = (ROOT / "devstack" / "demo.py").read_text().lower()
    named = {p.provider for p in pools} | {p.worker_name for p in pools} | set(FAKE_KITS)
    assert not [name for name in named if name.lower() in source]


def test_a_third_pool_is_counted_and_shown_like_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    third = Pool("strava", "strava-second")
    procfile_text = tmp_path / "Procfile"
    procfile_text.write_text((ROOT / "Procfile").read_text()
                             + f"third_bridge: CAIRN_PROVIDER={third.provider} CAIRN_WORKER_NAME={third.worker_name} "
                               "python -m bridges cairn\n")
    pools = procfile.pools(procfile.entries(procfile_text))
    assert pools[-1] == third and pools[:-1] == procfile.pools(procfile.entries())
    monkeypatch.setattr(demo, "procfile_pools", lambda: pools)
    run = demo.Demo(True, tmp_path, tmp_path)
    assert run.expected[third.worker_name] == FAKE_KITS[third.provider].demo_size.short
    assert f"{third.worker_name} ({third.provider})" in demo.parser().format_help()
