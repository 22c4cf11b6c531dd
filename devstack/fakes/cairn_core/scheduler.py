"""Jobs the dev core publishes on CAIRN_JOBS (reference §2.9, contract §3-§4, 0.7 pools).

Every job goes to one pool: ``cairn.jobs.<job>.<provider>.<worker_name>``. The
reconcile scheduler coalesces per minute through the message id and the
stream's 5-minute dedup window, skips providers whose budget is exhausted
(§2.12, app-scoped keys of 0.7), and publishes ``import_gear`` / daily
``import_metrics`` alongside reconcile only when the pool declares Gear /
a metric data type in its manifest (with a live worker).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NoKeysError, NotFoundError

from devstack.fakes.cairn_core.accounts import Account, utcnow
from devstack.fakes.cairn_core.bootstrap import KV_MANIFESTS, KV_PRESENCE, KV_RATE_LIMITS
from devstack.fakes.cairn_core.responders import parse_rfc3339, rfc3339
from devstack.fakes.cairn_core.router import ResultRouter

MAX_ENQUEUE = 500
KNOWN_EXT_IDS_CAP = 2000
RECONCILE_LOOKBACK = timedelta(days=30)
WATERMARK_OVERLAP = timedelta(hours=1)
METRICS_FIRST_RUN = timedelta(days=30)
METRICS_OVERLAP = timedelta(days=1)
METRICS_INTERVAL = timedelta(days=1)
SCHEDULER_TICK_S = 60.0
POLLING_INTERVAL_S = 60 * 60.0  # CAIRN_SCHEDULER_POLLING_INTERVAL default
METRIC_DATA_TYPES = frozenset({"Steps", "HRV", "RestingHR", "Sleep", "Weight", "WaterIntake"})
PRESENCE_LIVE_S = 45.0  # core's freshness window for presence records (reference §2.10)


def uuid7() -> str:
    """UUID v7 (time-ordered), as core's reconcile job ids; Python 3.11 has no uuid.uuid7."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms << 80) | (0x7 << 76) | ((rand >> 64) & 0xFFF) << 64 | (0b10 << 62) | (rand & ((1 << 62) - 1))
    return str(uuid.UUID(int=value))


@dataclass
class PublishedJob:
    subject: str
    payload: dict[str, Any]
    msg_id: str | None
    seq: int
    duplicate: bool


class JobPublisher:
    """Publishes jobs; runs on the core's loop thread."""

    def __init__(self, js: JetStreamContext, router: ResultRouter, job_subject: Any) -> None:
        self.js, self.router, self.job_subject = js, router, job_subject
        self.published: list[PublishedJob] = []

    async def enqueue(self, kind: str, payload: dict[str, Any], msg_id: str | None, *,
                      provider: str, worker_name: str) -> PublishedJob:
        subject = self.job_subject(kind, provider, worker_name)
        headers = {"Nats-Msg-Id": msg_id} if msg_id else None
        ack = await self.js.publish(subject, json.dumps(payload).encode(), headers=headers)
        job = PublishedJob(subject, payload, msg_id, ack.seq, bool(ack.duplicate))
        self.published.append(job)
        return job

    # ---- reconcile -------------------------------------------------------------------------
    def known_ext_ids(self, acct: Account, now: datetime) -> list[str]:
        since = now - RECONCILE_LOOKBACK
        if acct.sync_watermark is not None:
            since = max(since, acct.sync_watermark - WATERMARK_OVERLAP)
        ids = []
        with self.router.cond:
            records = list(self.router.sources.items())
        for (_, account_id, ext_id), rec in records:
            start = rec.activity.payload.start_time.ToDatetime(tzinfo=UTC)
            if account_id == acct.account_id and start >= since:
                ids.append(ext_id)
        return ids[:KNOWN_EXT_IDS_CAP]

    async def schedule_reconcile(self, acct: Account, *, reason: str = "scheduled", force: bool = False,
                                 webhook_seen: bool = False) -> list[PublishedJob]:
        """One reconcile (+ gear / metrics when declared); [] when the budget gate says no."""
        if acct.worker_name is None:
            raise ValueError("account has no pool (worker_name); core cannot route its jobs")
        if not force and await self.budget_exhausted(acct):
            return []
        now = utcnow()
        body: dict[str, Any] = {"job_id": uuid7(), "account_id": acct.account_id, "user_id": acct.user_id,
                                "provider": acct.provider}
        if acct.sync_watermark is not None:
            body["watermark"] = rfc3339(acct.sync_watermark)
        body.update(max_enqueue=MAX_ENQUEUE, webhook_seen=webhook_seen, reason=reason, issued_at=rfc3339(now))
        known = self.known_ext_ids(acct, now)
        if known:
            body["known_ext_ids"] = known
        minute = now.strftime("%Y-%m-%dT%H:%M")
        jobs = [await self.enqueue("reconcile", body, f"reconcile:{acct.account_id}:{minute}",
                                   provider=acct.provider, worker_name=acct.worker_name)]
        caps = await self.pool_capabilities(acct.provider, acct.worker_name)
        if "Gear" in caps:
            gear = {"job_id": str(uuid.uuid4()), "account_id": acct.account_id, "user_id": acct.user_id,
                    "provider": acct.provider, "reason": reason}
            jobs.append(await self.enqueue("import_gear", gear, f"import_gear:{acct.account_id}:{minute}",
                                           provider=acct.provider, worker_name=acct.worker_name))
        if caps & METRIC_DATA_TYPES and (acct.last_metrics_at is None
                                         or now - acct.last_metrics_at >= METRICS_INTERVAL):
            since = now - METRICS_FIRST_RUN if acct.last_metrics_at is None else acct.last_metrics_at - METRICS_OVERLAP
            metrics = {"job_id": str(uuid.uuid4()), "account_id": acct.account_id, "user_id": acct.user_id,
                       "provider": acct.provider, "since_unix": int(since.timestamp()),
                       "until_unix": int(now.timestamp())}
            jobs.append(await self.enqueue(
                "import_metrics", metrics, f"import_metrics:{acct.provider}:{acct.account_id}:{int(now.timestamp())}",
                provider=acct.provider, worker_name=acct.worker_name))
            acct.last_metrics_at = now
        return jobs

    async def due(self, acct: Account, polling_interval_s: float) -> bool:
        if not acct.auto_import or acct.status != "active" or acct.worker_name is None:
            return False
        return acct.last_sync_at is None or (utcnow() - acct.last_sync_at).total_seconds() >= polling_interval_s

    # ---- budget gate and declarations ------------------------------------------------------
    async def budget_exhausted(self, acct: Account) -> bool:
        """§2.12 on the 0.7 keys: app-scoped, else pool-scoped, plus the legacy provider keys."""
        try:
            kv = await self.js.key_value(KV_RATE_LIMITS)
        except NotFoundError:
            return False
        scope = acct.app_id or acct.worker_name
        prefixes = [f"{acct.provider}.{scope}", acct.provider]
        now = utcnow()
        for prefix in prefixes:
            for window in ("short", "daily"):
                try:
                    state = json.loads((await kv.get(f"{prefix}.{window}")).value or b"{}")
                    capacity, used = int(state.get("capacity", 0)), int(state.get("used", 0))
                    reset = parse_rfc3339(state.get("window_reset_at"))
                except (KeyNotFoundError, ValueError, TypeError, AttributeError):
                    continue
                if capacity > 0 and reset is not None and now < reset and used >= capacity:
                    return True
        return False

    async def pool_capabilities(self, provider: str, worker_name: str) -> set[str]:
        """DataTypes the pool declares in its *manifest*, while one of its workers is live.

        Contract §4: core publishes import_gear "only when a live worker for the
        provider declares Gear in its manifest" (and import_metrics when the
        account's pool declares a metric type). Presence ``capabilities`` are
        display data for the worker list and do not count; without a live
        presence record the manifest is a leftover of a stopped pool.
        """
        manifest = (await read_bucket(self.js, KV_MANIFESTS, lambda k: k == worker_name)).get(worker_name)
        if not isinstance(manifest, dict) or manifest.get("provider") not in (provider, None):
            return set()
        now = utcnow()
        presence = await read_bucket(self.js, KV_PRESENCE, lambda k: k.startswith(worker_name + "."))
        if not any(is_live(rec, now) for rec in presence.values()):
            return set()
        declared = manifest.get("capabilities") or {}
        return set(declared) if isinstance(declared, (dict, list)) else set()


async def read_bucket(js: JetStreamContext, bucket: str, match: Any = None) -> dict[str, Any]:
    """All live keys of a KV bucket as decoded JSON (undecodable values as raw text).

    The keys come from the bucket's stream state (``STREAM.INFO`` with a subjects filter), not
    nats-py's ``kv.keys()``: that one is a watcher whose "initial values done" marker can come
    before a key rewritten while it starts, so a presence record renewed every 2 s went missing
    from one read in a few hundred (a full test run saw a live worker's record absent, and a pool's
    Gear capability unseen). A subject with a delete marker still has a message: ``get`` skips it.
    """
    prefix = f"$KV.{bucket}."
    try:
        kv = await js.key_value(bucket)
        info = await js.stream_info(f"KV_{bucket}", subjects_filter=f"{prefix}>")
    except (NotFoundError, NoKeysError):
        return {}
    keys = [subject[len(prefix):] for subject in (info.state.subjects or {})]
    out: dict[str, Any] = {}
    for key in keys:
        if match is not None and not match(key):
            continue
        try:
            raw = (await kv.get(key)).value or b""
        except KeyNotFoundError:
            continue
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw.decode(errors="replace")
    return out


def parse_last_seen(record: dict[str, Any]) -> datetime | None:
    try:
        return parse_rfc3339(record.get("last_seen"))
    except ValueError:
        return None


def is_live(record: Any, now: datetime, max_age_s: float = PRESENCE_LIVE_S) -> bool:
    """A presence record core counts as live: a ``worker_key`` and a fresh ``last_seen``."""
    if not isinstance(record, dict) or not record.get("worker_key"):
        return False
    seen = parse_last_seen(record)
    return seen is not None and (now - seen).total_seconds() <= max_age_s
