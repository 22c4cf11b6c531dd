"""Count what happened to every job, from the dev servers' own records (never from the fleet's logs).

Voicy (the dev Worker API's job documents and its request log):

* **final**: ``completed`` or ``failed``; **failed** is reported with Voicy's ``lastError``;
* **duplicate execution**: more than one ``POST /result`` the server accepted (200) for one job;
* **stuck**: not final, and a worker still heartbeats it (``heartbeatAt`` younger than
  ``STUCK_HEARTBEAT_AGE_S``): held, but never finished within the quiescence bound;
* **lost**: every other job that is not final. A lost job still ``downloading``
  with no request about it after its last claim is the documented inherent
  window (DESIGN.md, "Windows no client can close": the claim response lost on
  the wire, or the bridge killed between the claim and its Redis record); it is
  counted as lost and reported as ``inherent`` too.

Cairn (the dev core's result router and the job stream itself):

* **final**: core accepted a result for the job (events, or a failure envelope);
  **failed** is a failure envelope (reported with its error code), or results
  core rejected (reported with the router's reason);
* **duplicate execution**: results from more than one delivery stored for one job:
  distinct ``result:<job>:d<n>`` ids (the ``:seg`` companion of a delivery is the
  same execution). The contract tolerates it (ingest is idempotent); it is still
  work done twice, and the target is 0;
* **lost**: no result, whether the message is still pending on the stream
  (unacked, undelivered) or was settled without one;
* **stuck**: of the pending ones, as many as the pool's consumers still hold
  ack-pending (a bridge keeps renewing them but never settles them).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from bench.chaos_rig import ChaosRig

STUCK_HEARTBEAT_AGE_S = 15.0  # a heartbeat younger than this means a worker still holds the job
FINAL_VOICY = ("completed", "failed")
_DELIVERY = re.compile(r"^(:d\d+)?")


@dataclass
class SideCount:
    jobs: int = 0
    final: int = 0
    completed: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    inherent: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    retried: int = 0  # jobs that needed more than one attempt/delivery (informative)
    notes: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"jobs": self.jobs, "final": self.final, "completed": self.completed,
                "failed": sum(self.failed.values()), "failed_reasons": dict(self.failed),
                "lost": len(self.lost), "lost_of_which_inherent": len(self.inherent),
                "stuck": len(self.stuck), "duplicate_executions": len(self.duplicates),
                "retried": self.retried, "lost_ids": self.lost[:20], "stuck_ids": self.stuck[:20],
                "duplicate_ids": self.duplicates[:20], **self.notes}


def orphaned_claim(doc: dict[str, Any], requests: list[dict[str, Any]]) -> bool:
    """The documented inherent window: ``downloading`` at Voicy, and no request about the job since
    its last claim (the claim response never reached a bridge that recorded it)."""
    claimed = doc.get("claimedAt")
    if doc["status"] != "downloading" or claimed is None:
        return False
    job_id = str(doc["_id"])
    return not any(r.get("job_id") == job_id and r["at"] >= claimed for r in requests)


def voicy_settled(rig: ChaosRig, orphan_after_s: float) -> bool:
    """Every job final, or an orphaned claim older than ``orphan_after_s`` (nothing will ever move it:
    waiting longer for it would only stretch the run to its bound)."""
    requests: list[dict[str, Any]] | None = None
    now = rig.voicy_api.state.now()
    for job in rig.voicy:
        if not job.job_id:
            return False
        doc = rig.voicy_api.get_job(job.job_id)
        if doc["status"] in FINAL_VOICY:
            continue
        requests = rig.voicy_api.requests if requests is None else requests
        if not (orphaned_claim(doc, requests) and now - doc["claimedAt"] > timedelta(seconds=orphan_after_s)):
            return False
    return True


def count_voicy(rig: ChaosRig) -> SideCount:
    out = SideCount()
    requests = rig.voicy_api.requests
    results = Counter(r.get("job_id") for r in requests if r.get("endpoint") == "result" and r["status"] == 200)
    now = rig.voicy_api.state.now()
    for job in rig.voicy:
        if not job.job_id:
            out.lost.append(f"never-enqueued:{job.file_id}")
            continue
        out.jobs += 1
        doc = rig.voicy_api.get_job(job.job_id)
        status = doc["status"]
        if doc.get("attempts", 0) > 1:
            out.retried += 1
        if results[job.job_id] > 1:
            out.duplicates.append(job.job_id)
        if status in FINAL_VOICY:
            out.final += 1
            if status == "completed":
                out.completed += 1
            else:
                out.failed[str(doc.get("lastError") or "no lastError")[:120]] += 1
            continue
        beat = doc.get("heartbeatAt")
        if beat is not None and now - beat < timedelta(seconds=STUCK_HEARTBEAT_AGE_S):
            out.stuck.append(f"{job.job_id}:{status}")
            continue
        out.lost.append(f"{job.job_id}:{status}")
        if orphaned_claim(doc, requests):
            out.inherent.append(job.job_id)
    return out


def _executions(job_id: str, msg_ids: set[str]) -> set[str]:
    prefix = f"result:{job_id}"
    return {_DELIVERY.match(m[len(prefix):]).group(0) for m in msg_ids}  # type: ignore[union-attr]


def cairn_result_ids(rig: ChaosRig, job_id: str, records: list[Any]) -> set[str]:
    prefix = f"result:{job_id}"
    return {r.msg_id for r in records if r.msg_id and (r.msg_id == prefix or r.msg_id.startswith(prefix + ":"))}


def pool_consumers(rig: ChaosRig) -> list[dict[str, Any]]:
    return [c for c in rig.core.consumers() if (c["filter_subject"] or "").endswith("." + rig.pool)
            or any(s.endswith("." + rig.pool) for s in (c["filter_subjects"] or []))]


def count_cairn(rig: ChaosRig) -> SideCount:
    out = SideCount()
    ingested, rejected = rig.core.ingested, rig.core.rejected
    by_job: dict[str, list[Any]] = {}
    for rec in ingested:
        if rec.msg_id and rec.msg_id.startswith("result:"):
            by_job.setdefault(rec.msg_id[len("result:"):].split(":")[0], []).append(rec)
    rejected_by_job: dict[str, list[Any]] = {}
    for rej in rejected:
        if rej.msg_id and rej.msg_id.startswith("result:"):
            rejected_by_job.setdefault(rej.msg_id[len("result:"):].split(":")[0], []).append(rej)
    consumers = pool_consumers(rig)
    ack_pending = sum(c["num_ack_pending"] for c in consumers)
    pending_ids: list[str] = []
    for job in rig.cairn:
        if job.seq is None:
            out.lost.append(f"never-published:{job.job_id}:{job.publish_error}")
            continue
        out.jobs += 1
        records = by_job.get(job.job_id, [])
        executions = _executions(job.job_id, cairn_result_ids(rig, job.job_id, records))
        if len(executions) > 1:
            out.duplicates.append(job.job_id)
        if any(e != ":d1" for e in executions):
            out.retried += 1
        if records:
            out.final += 1
            failures = [r for r in records if r.kind == "failure"]
            if failures and not any(r.kind == "events" for r in records):
                code = failures[0].data.get("error", {}).get("code", "failure envelope")
                out.failed[f"envelope:{code}"] += 1
            else:
                out.completed += 1
            continue
        for rej in rejected_by_job.get(job.job_id, []):
            out.failed[f"rejected:{rej.reason}"] += 1
        if rig.core.stream_holds(job.seq):
            pending_ids.append(job.job_id)
        else:
            out.lost.append(f"{job.job_id}:settled-without-result")
    held = min(ack_pending, len(pending_ids))
    out.stuck.extend(f"{j}:ack-pending" for j in pending_ids[:held])
    out.lost.extend(f"{j}:pending" for j in pending_ids[held:])
    out.notes["consumers"] = [{k: c[k] for k in ("name", "num_pending", "num_ack_pending", "num_redelivered")}
                              for c in consumers]
    out.notes["rejected_results"] = Counter(r.reason for r in rejected)
    return out


def cairn_quiet(rig: ChaosRig) -> bool:
    """Every measured job has a result and the pool's consumers hold nothing."""
    ingested = rig.core.ingested
    done = {r.msg_id[len("result:"):].split(":")[0] for r in ingested if r.msg_id and r.msg_id.startswith("result:")}
    if any(j.seq is not None and j.job_id not in done for j in rig.cairn):
        return False
    return all(c["num_pending"] == 0 and c["num_ack_pending"] == 0 for c in pool_consumers(rig))
