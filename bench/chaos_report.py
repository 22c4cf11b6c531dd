"""The chaos harness's output: one summary line, and docs/RELIABILITY.md regenerated from its latest run."""

from __future__ import annotations

import json
import os
import tomllib
from collections import Counter
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from bench import chaos_count, chaos_rig
from devstack.infra.stack import ROOT

DOC_PATH = ROOT / "docs" / "RELIABILITY.md"
# The document shows one current table per topic; the sections other harnesses own sit between
# these markers and a chaos run carries them over unchanged.
PARTS_BEGIN = "<!-- partitions:begin -->"  # bench/partitions_report.py writes between these
PARTS_END = "<!-- partitions:end -->"
HEALS_BEGIN = "<!-- heals:begin -->"  # the silent-cut heal table, from `python -m bench.heals`
HEALS_END = "<!-- heals:end -->"
TABLE_HEAD = ("| seed | window s | Voicy / Cairn jobs | kills | lost | duplicate | failed "
              "| stuck | crashed, not restarted | self-exits | quiet | total s |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|")


def summary_line(f: dict[str, Any]) -> str:
    return (f"chaos seed={f['seed']} window={f['window_s']:g}s voicy={f['voicy_jobs']} cairn={f['cairn_jobs']} "
            f"kills={f['kills']} infra={len(f['infra'])}: lost={f['lost']} duplicate={f['duplicate_executions']} "
            f"failed={f['failed']} stuck={f['stuck']} crashed_not_restarted={f['crashed_not_restarted']} "
            f"(self-exits={f['self_exits']}, quiet={'yes' if f['quiet'] else 'NO'}, "
            f"setup {f['setup_s']:g}s + window {f['window_s']:g}s + quiescence {f['quiescence_s']:g}s, "
            f"total {f['total_s']:g}s)")


def release() -> str:
    """The installed Switchyard release, else pyproject's: a run is named by release, never by commit."""
    try:
        return version("switchyard")
    except PackageNotFoundError:
        return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def run_identity() -> dict[str, str]:
    """What names a run in the document: the box, the UTC date and the release."""
    return {"box": f"{os.cpu_count()}-core box", "date": datetime.now(UTC).strftime("%Y-%m-%d"),
            "release": release()}


def caption(f: dict[str, Any]) -> str:
    """The one-line caption of a run's table: box, date, release; command."""
    return f"{f['box']}, {f['date']}, release {f['release']}; `{f['command']}`"


def _row(f: dict[str, Any]) -> str:
    cells = [str(f["seed"]), f"{f['window_s']:g}", f"{f['voicy_jobs']} / {f['cairn_jobs']}",
             str(f["kills"]), str(f["lost"]), str(f["duplicate_executions"]), str(f["failed"]), str(f["stuck"]),
             str(f["crashed_not_restarted"]), str(f["self_exits"]), "yes" if f["quiet"] else "no",
             f"{f['total_s']:g}"]
    return "| " + " | ".join(cells) + " |"


def previous_block(path: Path, begin: str, end: str) -> str:
    """The text between ``begin`` and ``end`` in the current document ("" when absent)."""
    text = path.read_text() if path.exists() else ""
    if begin not in text or end not in text:
        return ""
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def _presence(f: dict[str, Any]) -> str:
    samples = [k["cairn_live_presence"] for k in f["kill_log"] if k.get("cairn_live_presence", -1) >= 0]
    if not samples:
        return ""
    return (f"; core saw no live presence record of the pool at {samples.count(0)} of {len(samples)} "
            f"of them (C5, informative)")


def _detail(f: dict[str, Any]) -> str:
    kills = Counter(k["target"].split(" ", 1)[1] if " " in k["target"] else k["target"] for k in f["kill_log"])
    by_dyno = Counter(k["target"] for k in f["kill_log"])
    crashes = Counter(f"{c['dyno']} rc={c['rc']}" for c in f["self_exit_detail"])
    side = {name: {k: v for k, v in f[name].items()} for name in ("voicy", "cairn")}
    return "\n".join([
        f"- Time: setup {f['setup_s']:g} s (of which warm-up {f['warmup_s']:g} s), window {f['window_s']:g} s, "
        f"quiescence {f['quiescence_s']:g} s (bound {f['quiesce_bound_s']:g} s, reached: "
        f"{'yes' if f['quiet'] else 'no'}), total {f['total_s']:g} s; load average at the end {f['loadavg']}.",
        f"- Faults: {f['kills']} SIGKILLs ({dict(kills)}; by dyno {dict(by_dyno)}), "
        + ", ".join(f"{i['what']} at {i['t']:g} s (down {i['down_s']:g} s)" for i in f["infra"]) + ".",
        f"- Kills that landed with a Voicy download in flight: "
        f"{sum(1 for k in f['kill_log'] if k.get('voicy_downloading', 0) > 0)}, with a transcription in flight: "
        f"{sum(1 for k in f['kill_log'] if k.get('voicy_transcribing', 0) > 0)}, with Cairn jobs in flight: "
        f"{sum(1 for k in f['kill_log'] if k.get('cairn_in_flight', 0) > 0)} (of {f['kills']})" + _presence(f) + ".",
        f"- Supervisor: {f['restarts']} restarts; exits the harness did not cause (crashes): "
        f"{dict(crashes) or 'none'}; dynos down at the end: {f['down_at_end'] or 'none'}.",
        "",
        "```json",
        json.dumps(side, indent=2, default=str),
        "```",
    ])


def render(f: dict[str, Any], partitions: str = "", heals: str = "") -> str:
    r = chaos_rig
    return f"""# Reliability: the chaos harness

`python -m bench chaos` (also `make bench ARGS=chaos`) starts the dev stack (Redis with an AOF,
nats-server with JetStream on disk, moto S3, the dev Voicy Worker API, fake Telegram, the dev Cairn
core, fake Strava) and the Procfile's own command lines (both bridges, the gpu/io/provider workers,
beat; one dyno of every process type but `web`, and {r.GPU_SLOTS} gpu dynos, as the Procfile's gpu
line is `-c 1`) under a supervisor that restarts whatever dies, as a platform
would (`devstack/infra/supervisor.py`). It feeds Voicy voice messages of 5-20 s of speech and Cairn
`fetch_source` jobs over the first {r.FEED_SPAN_FRACTION:.0%} of a fixed window; during the window it
SIGKILLs a random fleet process every few seconds (either bridge, beat, a worker's main process or
one of its pool children), restarts Redis once and NATS once (SIGTERM, a few seconds down, back on
the same port and data directory), then waits, bounded, for quiescence. Every figure below is
counted from the dev servers' own records, never from the fleet's logs. Options: `--seed`,
`--window-s` (300), `--voicy-jobs` (60), `--cairn-jobs` (300), `--kill-every-s` (6),
`--quiesce-s` (300), `--no-doc`, `--json PATH`. A default run takes setup (10-25 s: one warm-up job per side) + the 5-min window + quiescence
(bounded; seconds when nothing is left behind) + teardown; the latest run's total is in its table.

Targets on the 2-core dev box: **0 lost, 0 duplicate executions, 0 stuck, 0 crashed-and-not-restarted**.

## What is counted

| figure | Voicy (dev Worker API) | Cairn (dev core + the job stream) |
|---|---|---|
| lost | not `completed`/`failed` at the end, and no worker heartbeats it | no result stored, the message still pending on `CAIRN_JOBS` (or settled without a result) |
| duplicate execution | more than one `POST /result` the server accepted (200) for one job | results of more than one delivery stored for one job: distinct `result:<job>:d<n>` msg-ids (a delivery's `:seg` companion is the same execution) |
| failed | `failed`, with Voicy's `lastError` (e.g. attempts exhausted after repeated kills) | a failure envelope (its error code), or results core rejected (the router's reason) |
| stuck | not final, but a worker still heartbeats it ({chaos_count.STUCK_HEARTBEAT_AGE_S:g} s) | pending and held ack-pending by the pool's consumer (renewed, never settled) |
| crashed, not restarted | a Procfile dyno not running at the end (after a {r.RESTART_CHECK_S:g} s restart grace) | same |
| self-exits | exits of a dyno's main process that the harness did not cause (e.g. a bridge exiting when Redis restarts); the supervisor restarted them, the target is still 0 | same |

"Duplicate" is narrower on Voicy's side because Voicy itself refuses a second result: once a job
is `completed`, a second `/result` gets 404, so at most one result is ever *accepted*; a job
transcribed twice whose second `/result` was refused is work done twice but not a duplicate
result. On Cairn's side the contract tolerates a second result (core's ingest is idempotent), so
every extra delivery's stored result counts.

**Inherent windows** (no client can close them; counted, and reported separately):
- Voicy: a claim whose response is lost on the wire, or a bridge killed between the claim
  response and its Redis record (one round trip), leaves a job `downloading` at Voicy with no
  record of ours (docs/DESIGN.md, "Windows no client can close"); such a lost job is reported as
  `lost_of_which_inherent`.
- Cairn: a provider task SIGKILLed after its result was published but before its outcome was
  recorded (one Redis write after the publish) runs again on redelivery and publishes `:d2`;
  at-least-once delivery cannot close that window, and the contract makes core's ingest
  idempotent for it. It is a few milliseconds wide; everything wider (a bridge dying while its
  tasks run, a Redis or NATS outage while results wait to be applied) is not inherent: the
  outcome ledger applies the recorded outcome instead of running the job again.
  A task killed *before* its publish is simply run again; that is not a duplicate.
- A Redis restart with `appendfsync everysec` can lose up to a second of writes if Redis *crashes*;
  the harness restarts it with SIGTERM, which flushes the AOF.

**Harness timings** (shortened so that recovery fits the bound; production defaults in brackets):
Voicy lease {r.VOICY_LEASE_TTL_MS / 1000:g} s [30], heartbeat {r.VOICY_HEARTBEAT_INTERVAL_MS / 1000:g} s [30],
stale-job cutoff (server and fleet) {r.VOICY_STALE_ACTIVE_JOB_MS / 1000:g} s [900]; Cairn AckWait
{r.CAIRN_ACK_WAIT_S:g} s [30], lease {r.CAIRN_LEASE_TTL_S:g} s [15]; Telegram downloads held
{r.TELEGRAM_DELAY_S[0]:g}-{r.TELEGRAM_DELAY_S[1]:g} s, Strava {r.STRAVA_DELAY_S * 1000:g} ms a call with
its rate budget out of the way; IO_CONCURRENCY={r.IO_CONCURRENCY}, PROVIDER_CONCURRENCY={r.PROVIDER_CONCURRENCY}.

## Reading the figures

- A Cairn duplicate names its cause in the kept fleet logs (`cairn_bridge.1.log`): `nak ... bridge
  error` (a Redis or NATS outage while results wait to be applied), `lease expired` (a bridge dying
  while its tasks run).
- Self-exits name the process and its exit code (e.g. `beat.1 rc=1`); every process rides out a
  Redis or NATS restart (R1), so each one is a finding.
- A Voicy job held `granted:<token>` whose task's message is in no queue is a *stranded grant*: its
  message was taken by a worker's main process that then died or lost Redis before its pool started
  it (kombu keeps it `unacked` for the 12 h visibility timeout), or lost by a Sentinel failover. The
  reaper audits confirmed grants against the broker and recovers such a job once its message has
  been out of every queue for `VOICY_WORKER_STRANDED_GRANT_MS` (60 s); `grant stranded` in the io log
  names each (`tests/voicy/test_voicy_stranded.py`).
- A run that misses a target keeps its working directory (every dyno's log, Redis's AOF, the
  JetStream store) and prints its path.

## Latest run

{caption(f)}

{TABLE_HEAD}
{_row(f)}

{_detail(f)}

## Partitions: several hosts, and a network that fails

{PARTS_BEGIN}
{partitions}
{PARTS_END}

## Silent cuts: how soon each process works again

{HEALS_BEGIN}
{heals}
{HEALS_END}
"""


def write_reliability(f: dict[str, Any], path: Path = DOC_PATH) -> Path:
    for key, value in run_identity().items():
        f.setdefault(key, value)
    path.write_text(render(f, previous_block(path, PARTS_BEGIN, PARTS_END),
                           previous_block(path, HEALS_BEGIN, HEALS_END)))
    return path
