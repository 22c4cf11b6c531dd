"""Periodic duties driven by Celery beat, and the schedule itself.

Each side's entries are scheduled only when that side is configured, so a
Voicy-only deployment does not run Cairn presence and vice versa. Entries
carry ``expires`` so that, when workers are down, stale heartbeats are dropped
instead of piling up (ecosystem §1.8).
"""

from __future__ import annotations

import logging
import os

from celery import shared_task

from tasks import app
from tasks.cairn import (MANIFEST_INTERVAL_S, MANIFEST_TASK, PRESENCE_INTERVAL_S, PRESENCE_OPTIONS,
                         PRESENCE_TASK)
from tasks.voicy import dispatch_transcription, runtime
from workers.voicy import pipeline

log = logging.getLogger(__name__)

DEFAULT_VOICY_HEARTBEAT_INTERVAL_S = 30.0
REAP_INTERVAL_S = 5.0
BEAT_EXPIRY_FACTOR = 0.9  # a periodic message older than 90% of its period is useless


@shared_task(name="voicy.heartbeat", ignore_result=True)
def voicy_heartbeat() -> int:
    """Heartbeat every held Voicy job whose lease is alive."""
    return pipeline.heartbeat_held(runtime())


@shared_task(name="voicy.reap", ignore_result=True)
def voicy_reap() -> int:
    """Recover jobs whose worker died: redispatch with media, else a retryable failure."""
    rt = runtime()
    recoveries = pipeline.reap(rt)
    for rec in recoveries:
        dispatch_transcription(rt, rec.job_id, rec.token)
    return len(recoveries)


def _ms_env(name: str, default_s: float) -> float:
    raw = os.environ.get(name, "")
    return float(raw) / 1000.0 if raw.strip() else default_s


def build_schedule() -> dict[str, dict[str, object]]:
    """The beat schedule for the sides configured in this environment."""
    schedule: dict[str, dict[str, object]] = {}
    if os.environ.get("VOICY_WORKER_API_URL"):
        heartbeat_s = _ms_env("VOICY_WORKER_HEARTBEAT_INTERVAL_MS", DEFAULT_VOICY_HEARTBEAT_INTERVAL_S)
        if heartbeat_s > 0:
            schedule["voicy-heartbeat"] = {"task": "voicy.heartbeat", "schedule": heartbeat_s,
                                           "options": {"expires": heartbeat_s * BEAT_EXPIRY_FACTOR}}
        reap_s = min(REAP_INTERVAL_S, _ms_env("VOICY_WORKER_LEASE_TTL_MS", 30.0) / 2)
        schedule["voicy-reap"] = {"task": "voicy.reap", "schedule": reap_s,
                                  "options": {"expires": reap_s * BEAT_EXPIRY_FACTOR}}
    if os.environ.get("CAIRN_NATS_URL"):
        # Presence goes to the fanout broadcast so every live pool instance writes its own record.
        schedule["cairn-presence"] = {"task": PRESENCE_TASK, "schedule": PRESENCE_INTERVAL_S,
                                      "options": {**PRESENCE_OPTIONS,
                                                  "expires": PRESENCE_INTERVAL_S * BEAT_EXPIRY_FACTOR}}
        schedule["cairn-manifest"] = {"task": MANIFEST_TASK, "schedule": MANIFEST_INTERVAL_S,
                                      "options": {"expires": MANIFEST_INTERVAL_S * BEAT_EXPIRY_FACTOR}}
    return schedule


app.conf.beat_schedule = build_schedule()
