"""The partition harness's output in docs/RELIABILITY.md: a row in the chaos runs' table, and its section.

The chaos harness regenerates the whole document and carries both over (the
table between its ``RUNS`` markers, this section between ``PARTS`` markers), so
chaos and partition runs stay side by side in one table.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import chaos_rig
from bench.chaos_report import (
    DOC_PATH,
    MAX_RUN_ROWS,
    PARTS_BEGIN,
    PARTS_END,
    RUNS_BEGIN,
    RUNS_END,
    TABLE_HEAD,
    _previous_rows,
)

PART_HEAD = ("| partition | how, for how long | lost | duplicate | stuck | failed | healthy again after | "
             "jobs final after | notes |\n|---|---|---|---|---|---|---|---|---|")


def row(f: dict[str, Any]) -> str:
    """The run as a row of the chaos table (window: none; kills: the partitions)."""
    parts = f["partitions"]
    total = {k: sum(p[k] for p in parts) for k in ("lost", "duplicate", "failed", "stuck")}
    cells = [datetime.now(UTC).strftime("%Y-%m-%d %H:%M"), f["commit"], str(f["seed"]), "-",
             "partitions", f"{len(parts)} partitions", str(total["lost"]), str(total["duplicate"]),
             str(total["failed"]), str(total["stuck"]), str(len(f["down_at_end"])), str(len(f["self_exits"])),
             "yes" if all(p.get("settled", True) for p in parts) else "no", f"{f['total_s']:g}", f"`{f['command']}`"]
    return "| " + " | ".join(cells) + " |"


def _note(p: dict[str, Any]) -> str:
    notes = []
    if "late_result_ok" in p:
        notes.append(f"recovered by {', '.join(p['results_accepted_from']) or 'nobody'}; "
                     f"cut host's late posts: {', '.join(p['cut_host_late_posts']) or 'none'}")
    if p["duplicate"]:
        notes.append(f"duplicate: {', '.join(p['ids']['duplicate'])}")
    if p["lost"]:
        notes.append(f"lost: {', '.join(p['ids']['lost'])}")
    return "; ".join(notes)


def section(f: dict[str, Any]) -> str:
    placement = ", ".join(f"{dyno} on {host}" for dyno, host in f.get("placement", {}).items())
    healthy = ("time until `switchyard health` says healthy again, target 60 s" if f["health_checked"]
               else "not measured: this tree has no `switchyard health` yet")
    lines = [
        "`python -m bench partitions` (also `make bench ARGS=partitions`) runs the Procfile fleet on hosts:",
        "Linux network namespaces of one machine on one switch (`devstack/netsim/hosts.py`), each with its",
        "own address, hostname, pid numbering and `/tmp`, the repository read-only, S3 the only shared",
        f"storage. Core ({', '.join(['Redis (AOF)', 'NATS', 'S3', 'the dev Voicy API', 'the dev Cairn core'])},",
        "and the Telegram and Strava fakes, Strava over https) is one host; the fleet's dynos are placed",
        f"{placement}. Only the Voicy hosts hold the media store's S3 credentials.",
        "",
        "Each partition lands while its own jobs are in flight, lasts a fixed time, heals, and is judged on",
        "its own jobs, counted as the chaos run counts them. A link cut takes the host's veth down at the",
        "switch; a DROP is an nftables rule in the host's namespace (`devstack/netsim/netfilter.py`):",
        "packets vanish, so TCP hangs as in a real partition. Partitions: `--only a,b`; one per side:",
        f"`--short`; none (the fleet across hosts, one job per side): `--smoke`. Voicy lease "
        f"{chaos_rig.VOICY_LEASE_TTL_MS / 1000:g} s, Cairn AckWait {chaos_rig.CAIRN_ACK_WAIT_S:g} s.",
        "",
        f"Latest run: `{f['command']}`, commit `{f['commit']}`; setup {f['setup_s']:g} s "
        f"(warm-up {f['warmup_s']:g} s), total {f['total_s']:g} s; dynos down at the end: "
        f"{', '.join(f['down_at_end']) or 'none'}; exits nobody caused: {len(f['self_exits'])}. "
        f"\"Healthy again after\": {healthy}. Log budget (`bench/partitions_budget.py`): "
        f"{f.get('log_budget', {}).get('unexplained', '-')} unexplained line(s).",
        "",
        PART_HEAD,
    ]
    for p in f["partitions"]:
        healthy_after = "-" if p["healthy_s"] is None else f"{p['healthy_s']:g} s"
        lines.append(f"| {p['name']} | {p['how']}, {p['down_s']:g} s | {p['lost']} | {p['duplicate']} | "
                     f"{p['stuck']} | {p['failed']} | {healthy_after} | {p['settle_s']:g} s | {_note(p)} |")
    return "\n".join(lines + ["", FOUND])


FOUND = """What the partitions found, each fixed with a test of its own:

- **A cut gpu host reported a job it no longer owned** (gpu-link). Its lease keeper's renewals
  failed (Redis unreachable: "unknown", not lost, R1); the lease expired and the reaper gave the job
  to the other gpu host; on the heal the cut host posted `/result` before its next renewal could
  learn the lease was gone, and Voicy accepted it (one worker token for the fleet). A Voicy
  execution now fences its lease (`LeaseKeeper.fence`: renew now, yes only on Redis's answer) before
  `/result` or `/failure` (`tests/voicy/test_lease_fence.py`).
- **A provider host cut from NATS stored a job's result twice** (provider-nats). A publish with no
  PubAck was given up and NAKed, but the message was on its way (buffered by nats-py, retransmitted
  by TCP after the heal) and landed; the redelivery published `:d2` as well. Likewise an activity
  result stored and its segment companion's presign unanswered. An unacknowledged publish is now
  retried within the delivery under the same `Nats-Msg-Id` (JetStream's dedup keeps one), and an
  unanswered presign asked again, for up to a minute (`tests/cairn/test_cairn_publish_retry.py`).
- **A rate-limit reservation NATS did not answer was taken for a bug** (provider-nats, by the log
  budget): the KV call's bare `TimeoutError` made an "unexpected" failure, a 30 s NAK counted toward
  the job's termination, so a long enough partition would have termed good jobs with an envelope. It
  is now `BudgetUnavailable`, a transient NAK (`tests/cairn/test_cairn_publish_retry.py`).
- **A Strava origin on plain http away from loopback** (the fake Strava on core) let the provider
  worker run with a manifest it could never publish (contract §1 allows http only on loopback): a
  traceback every manifest period. The worker now refuses it at start, naming
  `CAIRN_STRAVA_BASE_URL` (`tests/fleet/test_start_config.py`); the rig serves its fake Strava over https.
"""


def write(f: dict[str, Any], path: Path = DOC_PATH) -> Path:
    text = path.read_text()
    rows = (_previous_rows(path) + [row(f)])[-MAX_RUN_ROWS:]
    head, rest = text.split(RUNS_BEGIN, 1)
    _, tail = rest.split(RUNS_END, 1)
    text = head + RUNS_BEGIN + "\n" + TABLE_HEAD + "\n" + "\n".join(rows) + "\n" + RUNS_END + tail
    block = PARTS_BEGIN + "\n" + section(f) + "\n" + PARTS_END
    if PARTS_BEGIN in text and PARTS_END in text:
        head, rest = text.split(PARTS_BEGIN, 1)
        text = head + block + rest.split(PARTS_END, 1)[1]
    else:
        text = text.replace("## Runs\n", "## Partitions: several hosts, and a network that fails\n\n"
                            + block + "\n\n## Runs\n", 1)
    path.write_text(text)
    return path
