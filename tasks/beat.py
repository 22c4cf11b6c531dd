"""Beat's schedule: what runs periodically, and how often (the tasks live with their side).

Each side's entries are scheduled only when that side is configured, so a
Voicy-only deployment does not run Cairn duties and vice versa. Entries carry
``expires`` so that, when workers are down, stale heartbeats are dropped
instead of piling up (ecosystem §1.8).

* Voicy (``tasks.voicy``): ``voicy.heartbeat`` and ``voicy.reap``.
* Cairn: nothing. Presence and the manifest are each provider worker's own
  duty, renewed from its main process (``tasks.presence``, invariant C5): each
  pool has its own queue (``tasks.routes``, C6), and beat knows no pool, so it
  reads no ``CAIRN_*`` variable at all.

The schedule is built at ``import tasks``, i.e. in every Celery process. When
Voicy is configured (``VOICY_WORKER_API_URL`` set), its two periods are read
with the fleet's own validation (``VoicyTimings``): a bad value stops the
process with a ``ConfigError`` naming the variable, instead of a bare
``float()`` error or a silently dropped schedule. A Cairn-only process reads
no Voicy variable at all.

Beat sends no ``task-sent`` events (:func:`_quiet_housekeeping`), and the
workers send none for these tasks (``tasks.settings.QUIET_TASKS``): a reap
every few seconds would otherwise push the real jobs off Flower's first page.
The process runs ``tasks.hardening.scheduler.ResilientRedBeatScheduler`` (the Procfile's
``beat`` line), which rides out Redis restarts.
"""

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
    """The beat schedule for the sides configured in this environment."""
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
    """Beat only sends housekeeping: no ``task-sent`` events, so Flower lists the jobs people look for."""
    app.conf.task_send_sent_event = False


app.conf.beat_schedule = build_schedule()
