"""Flower configuration: ``celery -A tasks flower --conf=deploy/flowerconfig.py``.

Flower (2.2) applies ``FLOWER_*`` environment variables first, then executes
this file (tornado ``parse_config_file``: every top-level name that matches a
Flower option sets it), then the command line. A name set here therefore
*overrides* the matching ``FLOWER_*`` variable, so every option below reads
that variable itself and only supplies our default. Top-level names that are
not Flower options must start with ``_`` or be UPPER_CASE so they can never
collide with one (``port``, ``address``, ``auth``, ``db`` ... are options).

Why each choice (reference/ecosystem.md §1.9):

* **Authentication is mandatory.** On Heroku only ``web`` is reachable from the
  internet and Flower can shut workers down. We refuse to start without basic
  auth (``FLOWER_PASSWORD`` + ``FLOWER_USER``, or Flower's own
  ``FLOWER_BASIC_AUTH=user:pass``) or an OAuth provider (``FLOWER_AUTH``).
  ``/healthcheck`` and ``/metrics`` stay unauthenticated (Flower's design), so
  a load balancer and Prometheus can reach them; ``/api/*`` and the UI need auth.
* **inspect_timeout 10 s** (Flower's unit is milliseconds): ``/api/workers`` is
  filled by an inspect broadcast; with the 1 s default a worker that is busy
  (or a gpu parent under load) misses it and is shown offline.
* **purge_offline_workers**: dynos get a new hostname on every restart, so dead
  node names would pile up in the dashboard and in ``flower_worker_online``.
* **Provider pools apart.** Each pool's workers are named after their Procfile
  type (``provider.1@host``, ``garmin.1@host``) and consume only their pool's
  queue, ``provider.<pool>``; a Cairn task's routing key is that queue, its id
  starts ``cairn-<pool>-`` and a job's arguments name the pool
  (``tasks.routes``, ``tests/providers/test_pools.py`` reads them back from Flower's API).
* **A job can be found.** The ``args`` column is on by default: a Voicy task
  shows ``('<job id>', '…')``, a Cairn ``cairn.job`` its kind and job id first
  (``['fetch_source', {'job_id': ...}, ...]``), and Flower's search box finds
  either by its id. Not a per-kind task name through Celery's ``shadow``: the
  ``task-sent`` event keeps the real name, and when it reaches Flower after the
  worker's ``task-received`` (two publishers, no order) the task is renamed back.
* **Task arguments are masked.** Ours carry only job ids, stream sequences and
  lease tokens (S1); Voicy tasks are sent with an ``argsrepr`` that shows the
  job id and hides the token (``tasks.voicy.args_repr``), Cairn jobs with one
  that hides the lease token (``tasks.cairn.job_argsrepr``), and the formatter
  still masks tokens and parked-secret keys in the task pages, as defence in depth.
"""

from __future__ import annotations

import os
import re
import sys

from workers.logs import redact as _redact  # underscored: a top-level name here may be read as a Flower option

INSPECT_TIMEOUT_MS = 10_000.0
PURGE_OFFLINE_WORKERS_S = 3600
MAX_TASKS_IN_MEMORY = 20_000  # Flower keeps task state in memory; a 512 MB web dyno
# ``args`` second: a Voicy task shows its job id, a Cairn job its kind and job id (S1: no token).
TASKS_COLUMNS = "name,args,uuid,state,received,started,runtime,worker"
DEFAULT_FLOWER_USER = "admin"
EXIT_CONFIG_ERROR = 2

_TOKEN_RE = re.compile(r"\b[0-9a-f]{32}\b")  # lease tokens and request ids are uuid4().hex
_KEYED_RE = re.compile(r"""(['"](?:lease_token|reply_key|request_key|token)['"]\s*:\s*)['"][^'"]*['"]""")
_MASK = "'<masked>'"


def _refuse(message: str) -> None:
    print(f"switchyard flower: {message}", file=sys.stderr)
    raise SystemExit(EXIT_CONFIG_ERROR)


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        _refuse(f"invalid configuration: {name}: not a number")
        raise  # unreachable; keeps type checkers content


def _basic_auth_from_env() -> list[str] | None:
    """``FLOWER_USER``/``FLOWER_PASSWORD`` as Flower's ``user:password`` list, or None if not given."""
    password = os.environ.get("FLOWER_PASSWORD", "")
    if not password:
        return None
    user = os.environ.get("FLOWER_USER", "").strip() or DEFAULT_FLOWER_USER
    if ":" in user:
        _refuse("invalid configuration: FLOWER_USER: must not contain ':'")
    return [f"{user}:{password}"]


def _mask_text(text: str) -> str:
    return _TOKEN_RE.sub("<masked>", _KEYED_RE.sub(lambda m: m.group(1) + _MASK, _redact(text)))


def format_task(task):  # type: ignore[no-untyped-def]  # Flower option: called on a copy of each task
    """Mask tokens and secret-shaped text in the args, kwargs and result Flower shows."""
    for attr in ("args", "kwargs", "result"):
        value = getattr(task, attr, None)
        if isinstance(value, str) and value:
            setattr(task, attr, _mask_text(value))
    return task


# --- authentication ---------------------------------------------------------------
if not os.environ.get("FLOWER_BASIC_AUTH") and not os.environ.get("FLOWER_AUTH"):
    _auth = _basic_auth_from_env()
    if _auth is None:
        _refuse("invalid configuration: FLOWER_PASSWORD: required (or FLOWER_BASIC_AUTH=user:password, "
                "or FLOWER_AUTH with an OAuth provider); refusing to serve Flower without authentication")
    basic_auth = _auth

# --- behaviour ----------------------------------------------------------------------
inspect_timeout = _env_number("FLOWER_INSPECT_TIMEOUT", INSPECT_TIMEOUT_MS)
purge_offline_workers = int(_env_number("FLOWER_PURGE_OFFLINE_WORKERS", PURGE_OFFLINE_WORKERS_S))
max_tasks = int(_env_number("FLOWER_MAX_TASKS", MAX_TASKS_IN_MEMORY))
tasks_columns = os.environ.get("FLOWER_TASKS_COLUMNS", TASKS_COLUMNS)
