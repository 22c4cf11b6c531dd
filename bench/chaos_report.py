"""The chaos harness's output: one summary line, and docs/RELIABILITY.md (definitions, runs, latest detail).

The document is regenerated on every run; the table of runs is carried over
from the previous file (between the ``RUNS_BEGIN``/``RUNS_END`` markers), so a
"before" run on a branch and an "after" run on main stay side by side.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import chaos_count, chaos_rig
from devstack.infra.stack import ROOT

DOC_PATH = ROOT / "docs" / "RELIABILITY.md"
RUNS_BEGIN = "<!-- chaos-runs:begin -->"
RUNS_END = "<!-- chaos-runs:end -->"
PARTS_BEGIN = "<!-- partitions:begin -->"  # bench/partitions_report.py writes between these; chaos carries it over
PARTS_END = "<!-- partitions:end -->"
MAX_RUN_ROWS = 30
TABLE_HEAD = ("| date (UTC) | commit | seed | window s | Voicy / Cairn jobs | kills | lost | duplicate | failed "
              "| stuck | crashed, not restarted | self-exits | quiet | total s | command |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def summary_line(f: dict[str, Any]) -> str:
    return (f"chaos seed={f['seed']} window={f['window_s']:g}s voicy={f['voicy_jobs']} cairn={f['cairn_jobs']} "
            f"kills={f['kills']} infra={len(f['infra'])}: lost={f['lost']} duplicate={f['duplicate_executions']} "
            f"failed={f['failed']} stuck={f['stuck']} crashed_not_restarted={f['crashed_not_restarted']} "
            f"(self-exits={f['self_exits']}, quiet={'yes' if f['quiet'] else 'NO'}, "
            f"setup {f['setup_s']:g}s + window {f['window_s']:g}s + quiescence {f['quiescence_s']:g}s, "
            f"total {f['total_s']:g}s)")


def commit() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                f":!{DOC_PATH.relative_to(ROOT)}"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        branch = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return f"{branch}@{rev}{'+dirty' if dirty else ''}"


def _row(f: dict[str, Any]) -> str:
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    cells = [date, f["commit"], str(f["seed"]), f"{f['window_s']:g}", f"{f['voicy_jobs']} / {f['cairn_jobs']}",
             str(f["kills"]), str(f["lost"]), str(f["duplicate_executions"]), str(f["failed"]), str(f["stuck"]),
             str(f["crashed_not_restarted"]), str(f["self_exits"]), "yes" if f["quiet"] else "no",
             f"{f['total_s']:g}", f"`{f['command']}`"]
    return "| " + " | ".join(cells) + " |"


def _previous_rows(path: Path) -> list[str]:
    if not path.exists():
        return []
    text = path.read_text()
    if RUNS_BEGIN not in text or RUNS_END not in text:
        return []
    block = text.split(RUNS_BEGIN, 1)[1].split(RUNS_END, 1)[0]
    return [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| date")]


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
        f"- Command: `{f['command']}` (seed {f['seed']}), commit `{f['commit']}`, load average at the end "
        f"{f['loadavg']}.",
        f"- Time: setup {f['setup_s']:g} s (of which warm-up {f['warmup_s']:g} s), window {f['window_s']:g} s, "
        f"quiescence {f['quiescence_s']:g} s (bound {f['quiesce_bound_s']:g} s, reached: "
        f"{'yes' if f['quiet'] else 'no'}), total {f['total_s']:g} s.",
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


def render(f: dict[str, Any], rows: list[str], partitions: str = "") -> str:
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
(bounded; seconds when nothing is left behind) + teardown; the first default run on this box took
329 s in all (the total of every run is in the table).

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
  outcome ledger of issue 9 applies the recorded outcome instead of running the job again.
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

- Cairn duplicates come from a bridge dying while its tasks run (issue 9 §2), from results missed
  right after a bridge starts (§3), and from a Redis or NATS outage while results wait to be
  applied (the bridge NAKs "bridge error" although the task is still running or has published).
  The kept fleet logs (`cairn_bridge.1.log`) show which: `nak ... bridge error`, `lease expired`.
- Self-exits name the process and its exit code: `voicy_bridge.1 rc=1` and `beat.1 rc=1` at the
  Redis restart are issue 9 §4 (R1).
- A run that misses a target keeps its working directory (every dyno's log, Redis's AOF, the
  JetStream store) and prints its path.

## Partitions: several hosts, and a network that fails

{PARTS_BEGIN}
{partitions}
{PARTS_END}

## Runs

{RUNS_BEGIN}
{TABLE_HEAD}
{chr(10).join(rows)}
{RUNS_END}

## Latest run

{_detail(f)}
"""


def write_reliability(f: dict[str, Any], path: Path = DOC_PATH) -> Path:
    f.setdefault("commit", commit())
    rows = (_previous_rows(path) + [_row(f)])[-MAX_RUN_ROWS:]
    path.write_text(render(f, rows, previous_block(path, PARTS_BEGIN, PARTS_END)))
    return path
