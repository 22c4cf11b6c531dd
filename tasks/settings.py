"""Celery configuration for the whole fleet, with the reason for each choice on its constant."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from tasks.routes import TASK_QUEUES, TASK_ROUTES
from workers import dead_peers
from workers.config import load_settings
from workers.redisconn import DEFAULT_REDIS_URL, RedisSettings, parse_sentinel_url

__all__ = ["DEFAULT_REDIS_URL", "FleetSettings", "celery_config"]

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
# Celery then waits this soft-shutdown window for running tasks, ending it as
# soon as they have (tasks/hardening/quick_drain.py), so a short transcription or a
# download finishes here instead of being redone; then it cancels what still
# runs with the terminate signal, the task sees SystemExit and hands its job back
# (``workers.voicy.outcomes.hand_back``; Cairn tasks release their lease and the
# bridge NAKs). 10 s + cancel + exit stays well inside the 30 s before SIGKILL,
# and a SIGKILL is still safe: the lease expires and the reaper recovers the job.
# ``WORKER_SOFT_SHUTDOWN_TIMEOUT_S`` overrides it per process (0 = hand back at once).
WORKER_SOFT_SHUTDOWN_TIMEOUT_S = 10.0

RESULT_EXPIRES_S = 3600
BROKER_SOCKET_TIMEOUT_S = 30.0

# --- Redis outages (invariant R1) -----------------------------------------------------
# A Redis restart, an outage of up to a minute or a Sentinel failover must not stop any
# process. Workers: the consumer reconnects for ever (None = no limit; Celery's default
# gives up after 100 tries and exits), at start as well as later. Storing a result
# retries too, instead of losing the outcome the bridge waits for; the backend's sleeps
# double from 100 ms up to 5 s, for at most ``RESULT_BACKEND_MAX_RETRIES`` tries (about
# five minutes of outage) before the task is reported failed.
BROKER_CONNECTION_MAX_RETRIES = None
RESULT_BACKEND_MAX_RETRIES = 60
RESULT_BACKEND_BASE_SLEEP_MS = 100
RESULT_BACKEND_MAX_SLEEP_MS = 5000
# Sentinel: how long one Sentinel may take to answer before kombu asks the next one.
SENTINEL_SOCKET_TIMEOUT_S = 1.0

# --- Flower (issue 11 §5) ----------------------------------------------------------------
# Housekeeping sends no task events: voicy.reap and voicy.heartbeat run every few seconds
# and would push the jobs people look for off Flower's first page (29 of 69 tasks in a
# demo). Their own queue would not help (Flower lists tasks, not queues) and running them
# less often would slow recovery (the reaper must run twice per lease TTL). They still log
# on the io worker when they act, and `celery inspect` still shows them while running.
QUIET_TASKS = ("voicy.heartbeat", "voicy.reap")


REDBEAT_LOCK_TIMEOUT_S = 30  # a beat killed outright hands over to a waiting one after this

# Task attributes by name glob, first match wins per attribute (Celery's own annotation
# maps match exact names only, so a ``cairn.*`` key there silently applied to nothing).
TASK_ANNOTATIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    *((name, {"send_events": False}) for name in QUIET_TASKS),
    ("voicy.transcribe", {"soft_time_limit": GPU_SOFT_TIME_LIMIT_S, "time_limit": GPU_HARD_TIME_LIMIT_S}),
    ("voicy.download", {"soft_time_limit": IO_SOFT_TIME_LIMIT_S, "time_limit": IO_HARD_TIME_LIMIT_S}),
    ("cairn.*", {"soft_time_limit": PROVIDER_SOFT_TIME_LIMIT_S, "time_limit": PROVIDER_HARD_TIME_LIMIT_S}),
)


class GlobAnnotations:
    """A ``task_annotations`` entry that matches task names by glob (``cairn.*``)."""

    def __init__(self, rules: tuple[tuple[str, dict[str, Any]], ...]) -> None:
        self.rules = rules

    def annotate(self, task: Any) -> dict[str, Any] | None:
        merged: dict[str, Any] = {}
        for pattern, attrs in self.rules:
            if fnmatchcase(str(task.name), pattern):
                merged = {**attrs, **merged}
        return merged or None

    def annotate_any(self) -> None:
        return None


class FleetSettings(RedisSettings):
    """Settings shared by every process of the fleet (no prefix, Heroku-style names).

    ``REDIS_URL`` and its companions come from :class:`workers.redisconn.RedisSettings`,
    the one class that reads them.
    """

    model_config = SettingsConfigDict(extra="ignore", env_ignore_empty=True)

    soft_shutdown_timeout_s: float = Field(default=WORKER_SOFT_SHUTDOWN_TIMEOUT_S, ge=0,
                                           validation_alias="WORKER_SOFT_SHUTDOWN_TIMEOUT_S")


def _redis_connection(settings: RedisSettings) -> dict[str, Any]:
    """Broker and backend options for ``rediss://`` (TLS) or a Sentinel ``REDIS_URL`` (master name)."""
    if settings.sentinel:
        sentinel = {"master_name": settings.sentinel_master,
                    "sentinel_kwargs": {"socket_timeout": SENTINEL_SOCKET_TIMEOUT_S}}
        password = parse_sentinel_url(settings.redis_url).password
        if password:  # kombu reads the master's password from the transport options only
            sentinel["password"] = password
        return {"broker_transport_options": sentinel, "result_backend_transport_options": sentinel}
    if settings.redis_url.startswith("rediss://"):
        tls = settings.tls_options
        return {"broker_use_ssl": tls, "redis_backend_use_ssl": tls}
    return {}


def celery_config(settings: FleetSettings | None = None) -> dict[str, Any]:
    """The Celery configuration mapping (``app.conf.update(celery_config())``).

    Celery is the execution transport only: Voicy's requeue and JetStream's redelivery stay the
    source of truth for retrying a job, and a per-job lease in Redis (``workers.lease``) decides who
    owns it now, so every setting here keeps Celery from running a second copy of its own.
    """
    settings = settings or load_settings(FleetSettings)
    connection = _redis_connection(settings)
    transport = {
        "visibility_timeout": VISIBILITY_TIMEOUT_S,
        "socket_timeout": BROKER_SOCKET_TIMEOUT_S,
        # Silent cuts (D1): keepalive, TCP_USER_TIMEOUT, health checks and a connect bound, so a host
        # cut off without an RST works again within dead_peers.HEAL_BOUND_S of the heal.
        **dead_peers.redis_options(),
        **connection.pop("broker_transport_options", {}),
    }
    backend_transport = {"visibility_timeout": VISIBILITY_TIMEOUT_S,
                         **connection.pop("result_backend_transport_options", {})}
    return {
        **connection,
        "broker_url": settings.redis_url,
        # the transport's kind and the backend's URL; tasks.hardening installs our classes for them
        "broker_transport": "sentinel" if settings.sentinel else "redis",
        "result_backend": settings.redis_url,
        "broker_transport_options": transport,
        "result_backend_transport_options": backend_transport,
        "visibility_timeout": VISIBILITY_TIMEOUT_S,
        "broker_connection_retry_on_startup": True,
        "broker_connection_retry": True,
        "broker_connection_max_retries": BROKER_CONNECTION_MAX_RETRIES,
        "result_backend_always_retry": True,
        "result_backend_max_retries": RESULT_BACKEND_MAX_RETRIES,
        "result_backend_base_sleep_between_retries_ms": RESULT_BACKEND_BASE_SLEEP_MS,
        "result_backend_max_sleep_between_retries_ms": RESULT_BACKEND_MAX_SLEEP_MS,
        "redis_retry_on_timeout": True,
        "redis_socket_keepalive": True,  # its options: tasks/hardening/result_backend.py
        "redis_socket_connect_timeout": dead_peers.CONNECT_TIMEOUT_S,
        "redis_backend_health_check_interval": dead_peers.REDIS_HEALTH_CHECK_INTERVAL_S,
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
        "task_annotations": (GlobAnnotations(TASK_ANNOTATIONS),),
        "redbeat_redis_url": settings.redis_url,
        "redbeat_lock_timeout": REDBEAT_LOCK_TIMEOUT_S,
        "beat_max_loop_interval": 5,
    }
