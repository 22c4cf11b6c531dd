"""Beat's schedule: what runs periodically, and how often (the tasks live with their side)."""

from __future__ import annotations

import os

from celery.signals import beat_init

from tasks import app
from tasks.voicy import HEARTBEAT_TASK, REAP_TASK
from workers.config import load_settings
from workers.voicy.settings import VoicyTimings

REAP_INTERVAL_S = 5.0
REAPS_PER_LEASE_TTL = 2  # reap at least twice per lease lifetime so a dead job waits < 1.5 TTLs
BEAT_EXPIRY_FACTOR = 0.9  # a periodic message older than 90% of its period is useless


def build_schedule() -> dict[str, dict[str, object]]:
    """The beat schedule for the sides configured in this environment.

    Voicy (``voicy.heartbeat``, ``voicy.reap``) only when ``VOICY_WORKER_API_URL`` is set, its
    periods read with the fleet's own validation (``VoicyTimings``: a bad value is a
    ``ConfigError`` naming it). Cairn has no entry: presence is each pool's main process's own
    duty (``tasks.presence``, C5) and beat knows no pool. Entries carry ``expires`` so stale
    heartbeats are dropped while workers are down (ecosystem §1.8).
    """
    schedule: dict[str, dict[str, object]] = {}
    if os.environ.get("VOICY_WORKER_API_URL"):
        timings = load_settings(VoicyTimings)  # ConfigError naming a bad variable
        heartbeat_s = timings.heartbeat_interval_s  # None: HEARTBEAT_INTERVAL_MS=0 disables
        if heartbeat_s is not None:
            schedule["voicy-heartbeat"] = {"task": HEARTBEAT_TASK, "schedule": heartbeat_s,
                                           "options": {"expires": heartbeat_s * BEAT_EXPIRY_FACTOR}}
        reap_s = min(REAP_INTERVAL_S, timings.lease_ttl_s / REAPS_PER_LEASE_TTL)
        schedule["voicy-reap"] = {"task": REAP_TASK, "schedule": reap_s,
                                  "options": {"expires": reap_s * BEAT_EXPIRY_FACTOR}}
    return schedule


@beat_init.connect
def _quiet_housekeeping(**_: object) -> None:
    """Beat only sends housekeeping: no ``task-sent`` events, so Flower lists the jobs people look for.

    The workers send none for these tasks either (``tasks.settings.QUIET_TASKS``).
    """
    app.conf.task_send_sent_event = False


app.conf.beat_schedule = build_schedule()
