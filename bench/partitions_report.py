"""The partition harness's output: its section of docs/RELIABILITY.md, the latest run's table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import chaos_rig
from bench.chaos_report import DOC_PATH, PARTS_BEGIN, PARTS_END, caption, run_identity

PART_HEAD = ("| partition | how, for how long | lost | duplicate | stuck | failed | healthy again after | "
             "jobs final after | notes |\n|---|---|---|---|---|---|---|---|---|")


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
        f"{caption(f)}; setup {f['setup_s']:g} s "
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
    return "\n".join(lines + ["", HOLDS])


HOLDS = """What holds each partition's figures at zero, each with a test of its own:

- A Voicy execution fences its lease (`LeaseKeeper.fence`: renew now, yes only on Redis's answer)
  before `/result` or `/failure`, so a host cut past its lease's expiry never reports a job the
  reaper gave to another host (gpu-link; `tests/voicy/test_lease_fence.py`).
- A publish with no PubAck is retried within the delivery under the same `Nats-Msg-Id` (JetStream's
  dedup keeps one), and an unanswered presign asked again, for up to a minute, so a message nats-py
  buffered across a cut and delivered after the heal is stored once (provider-nats;
  `tests/cairn/test_cairn_publish_retry.py`).
- A rate-limit reservation NATS does not answer is `BudgetUnavailable`, a transient NAK that does
  not count toward the job's termination (provider-nats; `tests/cairn/test_cairn_publish_retry.py`).
- The provider worker refuses at start a Strava origin on plain http away from loopback (contract
  §1 allows http only on loopback), naming `CAIRN_STRAVA_BASE_URL` (`tests/fleet/test_start_config.py`);
  the rig serves its fake Strava over https.
"""


def write(f: dict[str, Any], path: Path = DOC_PATH) -> Path:
    """Replace the partitions section of the document (appended when the document has none)."""
    for key, value in run_identity().items():
        f.setdefault(key, value)
    text = path.read_text()
    block = PARTS_BEGIN + "\n" + section(f) + "\n" + PARTS_END
    if PARTS_BEGIN in text and PARTS_END in text:
        head, rest = text.split(PARTS_BEGIN, 1)
        text = head + block + rest.split(PARTS_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n## Partitions: several hosts, and a network that fails\n\n" + block + "\n"
    path.write_text(text)
    return path
