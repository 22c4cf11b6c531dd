"""Periodic duties driven by Celery beat, and the schedule itself.

Each side's entries are scheduled only when that side is configured, so a
Voicy-only deployment does not run Cairn presence and vice versa. Entries
carry ``expires`` so that, when workers are down, stale heartbeats are dropped
instead of piling up (ecosystem §1.8).

The schedule is built at ``import tasks``, i.e. in every Celery process. When
Voicy is configured (``VOICY_WORKER_API_URL`` set), its two periods are read
with the fleet's own validation (``VoicyTimings``): a bad value stops the
process with a ``ConfigError`` naming the variable, instead of a bare
``float()`` error or a silently dropped schedule. A Cairn-only process reads
no Voicy variable at all.
"""

from __future__ import annotations

import logging
import os

from celery import shared_task

from tasks import app
from tasks.cairn import MANIFEST_INTERVAL_S, MANIFEST_TASK, PRESENCE_OPTIONS, PRESENCE_TASK
from tasks.voicy import dispatch_transcription, runtime
from workers.cairn.settings import CairnTimings
from workers.config import load_settings
from workers.voicy import pipeline
from workers.voicy.settings import VoicyTimings

log = logging.getLogger(__name__)

REAP_INTERVAL_S = 5.0
REAPS_PER_LEASE_TTL = 2  # reap at least twice per lease lifetime so a dead job waits < 1.5 TTLs
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


def build_schedule() -> dict[str, dict[str, object]]:
    """The beat schedule for the sides configured in this environment."""
    schedule: dict[str, dict[str, object]] = {}
    if os.environ.get("VOICY_WORKER_API_URL"):
        timings = load_settings(VoicyTimings)  # ConfigError naming a bad variable
        heartbeat_s = timings.heartbeat_interval_s  # None: HEARTBEAT_INTERVAL_MS=0 disables
        if heartbeat_s is not None:
            schedule["voicy-heartbeat"] = {"task": "voicy.heartbeat", "schedule": heartbeat_s,
                                           "options": {"expires": heartbeat_s * BEAT_EXPIRY_FACTOR}}
        reap_s = min(REAP_INTERVAL_S, timings.lease_ttl_s / REAPS_PER_LEASE_TTL)
        schedule["voicy-reap"] = {"task": "voicy.reap", "schedule": reap_s,
                                  "options": {"expires": reap_s * BEAT_EXPIRY_FACTOR}}
    if os.environ.get("CAIRN_NATS_URL"):
        # Presence goes to the fanout broadcast so every live pool instance writes its own record.
        presence_s = load_settings(CairnTimings).presence_interval_s  # ConfigError naming a bad variable
        schedule["cairn-presence"] = {"task": PRESENCE_TASK, "schedule": presence_s,
                                      "options": {**PRESENCE_OPTIONS,
                                                  "expires": presence_s * BEAT_EXPIRY_FACTOR}}
        schedule["cairn-manifest"] = {"task": MANIFEST_TASK, "schedule": MANIFEST_INTERVAL_S,
                                      "options": {"expires": MANIFEST_INTERVAL_S * BEAT_EXPIRY_FACTOR}}
    return schedule


app.conf.beat_schedule = build_schedule()
