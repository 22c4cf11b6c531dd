"""Thin Celery tasks for Voicy: read the arguments, call ``workers.voicy``, dispatch the next step."""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from celery import Task, shared_task
from celery.concurrency.prefork import TaskPool
from celery.signals import celeryd_after_setup, worker_process_init

from tasks.hardening.transport import TaskMessage, task_messages
from tasks.routes import QUEUE_GPU, QUEUE_IO
from tasks.settings import FleetSettings
from tasks.shapes import ShapeRefused, VoicyJobArgs, read_voicy_job
from workers.config import load_settings
from workers.errors import ConfigError
from workers.logs import setup_logging
from workers.transcribe import engine
from workers.voicy import pipeline, transcription
from workers.voicy.grants import BrokerMessages
from workers.voicy.runtime import VoicyRuntime
from workers.voicy.settings import load_voicy_settings

log = logging.getLogger(__name__)

TRANSCRIBE_TASK = "voicy.transcribe"
DOWNLOAD_TASK = "voicy.download"
HEARTBEAT_TASK = "voicy.heartbeat"  # beat, on the io pool
REAP_TASK = "voicy.reap"  # beat, on the io pool
HIDDEN_TOKEN = "…"  # what Flower and task events show in place of the lease token
JOB_TASKS = frozenset({DOWNLOAD_TASK, TRANSCRIBE_TASK})  # the tasks that carry a job's grant: (job id, token)

_runtime: VoicyRuntime | None = None
_runtime_lock = threading.Lock()


def runtime() -> VoicyRuntime:
    """The process's Voicy runtime, built on first use (after fork, never in the parent)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = VoicyRuntime.from_env(load_settings(FleetSettings).redis_url)
        return _runtime


def pool_processes(worker: object) -> int:
    """Processes in ``worker``'s pool: its concurrency for prefork, else one process."""
    pool_cls = getattr(worker, "pool_cls", None)
    if isinstance(pool_cls, type) and issubclass(pool_cls, TaskPool):
        return int(getattr(worker, "concurrency", 1) or 1)
    return 1


@celeryd_after_setup.connect
def _share_cores_between_pool_processes(instance: object, **_: object) -> None:
    """In the worker's parent, before the pool forks: tell the engine how many processes share the cores.

    Sent once the concurrency is final (``-c``, ``auto`` resolved); the children
    inherit the value, and each sizes its model's CPU threads from it
    (``VOICY_WORKER_CPU_THREADS=0``).
    """
    engine.set_pool_processes(pool_processes(instance))


@celeryd_after_setup.connect
def _check_voicy_settings_at_start(instance: object, **_: object) -> None:
    """A worker of the Voicy pools stops at start on a bad ``VOICY_WORKER_*``, naming the variable.

    The runtime is built lazily in each pool process (after fork), so without
    this a bad value (say ``VOICY_WORKER_LANGUAGE``) would only surface as a
    failed task, job after job. Checked only when Voicy is configured
    (``VOICY_WORKER_API_URL``) and the worker consumes ``io`` or ``gpu``;
    SystemExit, since Celery logs and swallows a signal handler's exceptions.
    """
    if not os.environ.get("VOICY_WORKER_API_URL"):
        return
    amqp = getattr(getattr(instance, "app", None), "amqp", None)
    queues = set(amqp.queues.consume_from or ()) if amqp is not None else set()
    if queues and not queues & {QUEUE_IO, QUEUE_GPU}:  # no -Q consumes every queue
        return
    try:
        load_voicy_settings()
    except ConfigError as exc:
        print(f"switchyard voicy worker: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


@worker_process_init.connect
def _reset_after_fork(**_: object) -> None:
    """A forked child must not reuse the parent's sockets: drop any inherited runtime."""
    global _runtime
    _runtime = None
    setup_logging(own_handler=False)  # Celery installed the handlers; ours would print twice


def args_repr(job_id: str) -> str:
    """The task's arguments as Flower and task events show them: the job id, the token hidden.

    Job task arguments are only a job id and a lease token, so nothing secret can reach Flower or the
    result backend (S1); the token is not a credential, but it names an ownership grant.
    """
    return repr((job_id, HIDDEN_TOKEN))


def dispatch(rt: VoicyRuntime, task: Task, job_id: str, token: str) -> None:
    """Send ``task`` for the job's pending grant to ``token``, then confirm the grant.

    Every Voicy job task is sent here, the second half of the lease's two-phase grant
    (``workers.voicy.pipeline``): the grant was made with a short pending TTL, the task is sent,
    and only then is the grant extended for its time in the queue. The order is the point:
    confirming first would recreate the long-lived grant for a task that a kill before the send
    never delivers (V1); a process killed in between leaves a grant that expires.
    """
    task.apply_async(args=[job_id, token], argsrepr=args_repr(job_id))
    pipeline.confirm_grant(rt, job_id, token)


def dispatch_download(rt: VoicyRuntime, job_id: str, token: str) -> None:
    dispatch(rt, download, job_id, token)


def dispatch_transcription(rt: VoicyRuntime, job_id: str, token: str) -> None:
    dispatch(rt, transcribe, job_id, token)


def read_job(task: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> VoicyJobArgs | None:
    """The job task's ``(job id, token)``, or None once a shape this release cannot read was refused.

    Refused with a clear line and handed back to Voicy as a retryable failure (``pipeline.refuse``):
    a worker of the release that sent it takes the job again. A task whose job cannot even be named
    is left for the reaper's grant audit, which recovers the job once its task is out of every queue.
    """
    try:
        return read_voicy_job(task, args, kwargs)
    except ShapeRefused as exc:
        if exc.job_id is not None and exc.token is not None:
            pipeline.refuse(runtime(), exc.job_id, exc.token, str(exc))
        else:
            log.error("%s; not run (job %s): the reaper recovers it once its grant is stranded", exc,
                      exc.job_id or "unknown")
        return None


@shared_task(name=DOWNLOAD_TASK, ignore_result=True)
def download(*args: Any, **kwargs: Any) -> None:
    """io: fetch the media into the store, mark it downloaded, queue the transcription (``(job_id, token)``)."""
    job = read_job(DOWNLOAD_TASK, args, kwargs)
    if job is None:
        return
    rt = runtime()
    next_token = pipeline.run_download(rt, job.job_id, job.token)
    if next_token is not None:
        dispatch_transcription(rt, job.job_id, next_token)


@shared_task(name=TRANSCRIBE_TASK, ignore_result=True)
def transcribe(*args: Any, **kwargs: Any) -> bool:
    """gpu: transcribe with progress and post the result (with ready short jobs batched in)."""
    job = read_job(TRANSCRIBE_TASK, args, kwargs)
    if job is None:
        return False
    return transcription.run_transcription(runtime(), job.job_id, job.token)


# Beat's Voicy duties (scheduled in ``tasks.beat``; quiet in Flower, see ``tasks.settings.QUIET_TASKS``).
@shared_task(name=HEARTBEAT_TASK, ignore_result=True)
def heartbeat() -> int:
    """Heartbeat every held Voicy job whose lease is alive."""
    return pipeline.heartbeat_held(runtime())


def broker_messages(rt: VoicyRuntime) -> BrokerMessages:
    """The grant tokens of the job tasks in the broker (the broker is the fleet's Redis, ``REDIS_URL``)."""
    waiting, delivered = task_messages(rt.redis, (QUEUE_IO, QUEUE_GPU), JOB_TASKS)
    return BrokerMessages(queued=_tokens(waiting), delivered=_tokens(delivered))


def _tokens(messages: list[TaskMessage]) -> frozenset[str]:
    return frozenset(str(m.args[1]) for m in messages if len(m.args) == 2)


@shared_task(name=REAP_TASK, ignore_result=True)
def reap() -> int:
    """Recover jobs whose worker died, or whose task no worker will run: redispatch with media, else a
    retryable failure."""
    rt = runtime()
    recoveries = pipeline.reap(rt, lambda: broker_messages(rt))
    for rec in recoveries:
        dispatch_transcription(rt, rec.job_id, rec.token)
    return len(recoveries)
