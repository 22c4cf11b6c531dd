"""Celery configuration for the whole fleet, with the reasons for each choice.

Celery is the *execution transport*; the external systems (Voicy's requeue,
JetStream's redelivery) stay the source of truth for retrying a job, and a
per-job lease in Redis (``workers.lease``) decides who owns a job now
(ARCHITECTURE.md "Who redelivers"). Every setting below serves that rule.
See reference/ecosystem.md §1.2-§1.5 for what goes wrong with the defaults.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from tasks.result_backend import result_backend_url
from workers.config import load_settings

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

# --- acknowledgement and prefetch -------------------------------------------------
# Early ack (the default, acks_late=False): a message is acked when a worker
# *starts* it, so Celery itself never runs a second copy. Losing a task to a
# SIGKILL is handled above Celery: the Voicy lease reaper redispatches or
# reports a retryable failure, and the Cairn bridge NAKs on a missed deadline.
# acks_late + reject_on_worker_lost would instead loop a poisonous job forever
# and duplicate long jobs through the visibility timeout (ecosystem §1.2, §1.3).
TASK_ACKS_LATE = False
TASK_REJECT_ON_WORKER_LOST = False
# One message reserved per process, and none prefetched while busy: a reserved
# message sitting behind a 20-minute transcription is invisible to idle hosts
# and, under Redis, subject to visibility-timeout redelivery (ecosystem §1.3(c)).
WORKER_PREFETCH_MULTIPLIER = 1
WORKER_DISABLE_PREFETCH = True

# --- Redis visibility timeout ------------------------------------------------------
# With early ack nothing stays unacked for long, but the sweep is global across
# queues and apps sharing this Redis, so we set a long value in all three places
# (celery/celery#7651): a long GPU job must never be restored to its queue.
VISIBILITY_TIMEOUT_S = 12 * 3600

# --- time limits -------------------------------------------------------------------
# Prefork pools enforce these. The soft limit lets a task report a retryable
# failure before the hard kill replaces the child.
GPU_SOFT_TIME_LIMIT_S = 3 * 3600
GPU_HARD_TIME_LIMIT_S = GPU_SOFT_TIME_LIMIT_S + 120
IO_SOFT_TIME_LIMIT_S = 15 * 60
IO_HARD_TIME_LIMIT_S = IO_SOFT_TIME_LIMIT_S + 60
PROVIDER_SOFT_TIME_LIMIT_S = 10 * 60
PROVIDER_HARD_TIME_LIMIT_S = PROVIDER_SOFT_TIME_LIMIT_S + 30
# A prefork child that loads a large-v3 model at init would exceed the 4 s
# default; we load lazily on the first task, and still give init some room.
WORKER_PROC_ALIVE_TIMEOUT_S = 60.0

# --- shutdown (Heroku: SIGTERM to every process of the dyno, SIGKILL 30 s later) --------
# The Procfile runs workers with REMAP_SIGTERM=SIGQUIT: SIGTERM starts a *cold*
# shutdown and pool children ignore SIGTERM (billiard), so nothing dies at once.
# Celery then waits this soft-shutdown window for running tasks (it sleeps the
# whole window whenever a task is running), so a short transcription or a
# download finishes here instead of being redone; then it cancels what still
# runs with the terminate signal, the task sees SystemExit and hands its job back
# (``workers.voicy.pipeline.hand_back``; Cairn tasks release their lease and the
# bridge NAKs). 10 s + cancel + exit stays well inside the 30 s before SIGKILL,
# and a SIGKILL is still safe: the lease expires and the reaper recovers the job.
# ``WORKER_SOFT_SHUTDOWN_TIMEOUT_S`` overrides it per process (0 = hand back at once).
WORKER_SOFT_SHUTDOWN_TIMEOUT_S = 10.0

RESULT_EXPIRES_S = 3600
BROKER_SOCKET_TIMEOUT_S = 30.0
BROKER_HEALTH_CHECK_INTERVAL_S = 25.0


class FleetSettings(BaseSettings):
    """Settings shared by every process of the fleet (no prefix, Heroku-style names)."""

    model_config = SettingsConfigDict(extra="ignore")

    redis_url: str = Field(default=DEFAULT_REDIS_URL, validation_alias="REDIS_URL",
                           pattern=r"^rediss?://")
    soft_shutdown_timeout_s: float = Field(default=WORKER_SOFT_SHUTDOWN_TIMEOUT_S, ge=0,
                                           validation_alias="WORKER_SOFT_SHUTDOWN_TIMEOUT_S")


def _redis_ssl(url: str) -> dict[str, Any]:
    """TLS options for ``rediss://`` (Heroku Redis presents a self-signed certificate).

    ``REDIS_SSL_CERT_REQS`` is ``none`` (Heroku's documented setting), ``optional`` or ``required``.
    """
    if not url.startswith("rediss://"):
        return {}
    import ssl
    import os

    reqs = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}[
        os.environ.get("REDIS_SSL_CERT_REQS", "none").lower()]
    return {"broker_use_ssl": {"ssl_cert_reqs": reqs}, "redis_backend_use_ssl": {"ssl_cert_reqs": reqs}}


def celery_config(settings: FleetSettings | None = None) -> dict[str, Any]:
    """The Celery configuration mapping (``app.conf.update(celery_config())``)."""
    from tasks.routes import TASK_ROUTES, TASK_QUEUES

    settings = settings or load_settings(FleetSettings)
    transport = {
        "visibility_timeout": VISIBILITY_TIMEOUT_S,
        "socket_timeout": BROKER_SOCKET_TIMEOUT_S,
        "health_check_interval": BROKER_HEALTH_CHECK_INTERVAL_S,
    }
    ssl = _redis_ssl(settings.redis_url)
    return {
        **ssl,
        "broker_url": settings.redis_url,
        "result_backend": result_backend_url(settings.redis_url),  # SET EX, not the deprecated SETEX
        "broker_transport_options": dict(transport),
        "result_backend_transport_options": {"visibility_timeout": VISIBILITY_TIMEOUT_S},
        "visibility_timeout": VISIBILITY_TIMEOUT_S,
        "broker_connection_retry_on_startup": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": TASK_ACKS_LATE,
        "task_reject_on_worker_lost": TASK_REJECT_ON_WORKER_LOST,
        "worker_prefetch_multiplier": WORKER_PREFETCH_MULTIPLIER,
        "worker_disable_prefetch": WORKER_DISABLE_PREFETCH,
        "worker_proc_alive_timeout": WORKER_PROC_ALIVE_TIMEOUT_S,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_soft_shutdown_timeout": settings.soft_shutdown_timeout_s,
        "worker_hijack_root_logger": False,
        "task_routes": TASK_ROUTES,
        "task_queues": TASK_QUEUES,
        "task_default_queue": "io",
        "task_create_missing_queues": True,
        "task_track_started": True,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "result_expires": RESULT_EXPIRES_S,
        "task_annotations": {
            "voicy.transcribe": {"soft_time_limit": GPU_SOFT_TIME_LIMIT_S,
                                 "time_limit": GPU_HARD_TIME_LIMIT_S},
            "voicy.download": {"soft_time_limit": IO_SOFT_TIME_LIMIT_S,
                               "time_limit": IO_HARD_TIME_LIMIT_S},
            "cairn.*": {"soft_time_limit": PROVIDER_SOFT_TIME_LIMIT_S,
                        "time_limit": PROVIDER_HARD_TIME_LIMIT_S},
        },
        "redbeat_redis_url": settings.redis_url,
        "redbeat_lock_timeout": 30,
        "beat_max_loop_interval": 5,
    }
