"""Flower configuration: ``celery -A tasks flower --conf=deploy/flowerconfig.py``."""

# Flower applies FLOWER_* variables, then runs this file (every top-level name matching a Flower option
# sets it, so each option below reads its variable itself and only supplies our default; other names are
# UPPER_CASE or start with _ so they never collide with one), then the command line. Why each choice:
# docs/operations.md section 5 and deploy/README.md "Flower".

from __future__ import annotations

import ast
import os
import re
import sys

from tasks import queue_metrics as _queue_metrics
from workers.logs import redact as _redact  # underscored: a top-level name here may be read as a Flower option

INSPECT_TIMEOUT_MS = 10_000.0  # /api/workers is an inspect broadcast: at 1 s a busy worker shows offline
PURGE_OFFLINE_WORKERS_S = 3600  # dynos get a new hostname on every restart: dead names would pile up
MAX_TASKS_IN_MEMORY = 20_000  # Flower keeps task state in memory; a 512 MB web dyno
# The short columns first, so the worker is on screen; then ``args``, where a Voicy task shows its job id
# and a Cairn job its kind and whole job id (``format_task``); the long uuid (the task page's link) last.
TASKS_COLUMNS = "name,state,worker,args,received,started,runtime,uuid"
CAIRN_JOB_TASK = "cairn.job"  # tasks.cairn.JOB_TASK; its args repr is [kind, payload, meta] (tasks.cairn.job_argsrepr)
CAIRN_SHOWN_META = ("pool", "delivery")  # what of a Cairn job's meta the list shows after its job id
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


def _cairn_job_line(args: str) -> str:
    """A Cairn job's args as the list shows them: ``<kind> <job id> (account …, pool …, delivery n)``.

    Its full repr runs to some 400 characters, so the list's args column (one line, no wrap) pushed the
    columns after it off-screen and cut a job id at the screen's edge: ids a reconcile spawns share the
    reconcile's id as a long prefix and differ only at their end. Flower's search and its JSON API keep
    the full repr; this is display only. Any other shape is shown unchanged.
    """
    try:
        kind, payload, meta = ast.literal_eval(args)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return args
    if not isinstance(payload, dict) or not isinstance(meta, dict):
        return args
    details = [f"account {payload['account_id']}"] if payload.get("account_id") else []
    details += [f"{key} {meta[key]}" for key in CAIRN_SHOWN_META if key in meta]
    return f"{kind} {payload.get('job_id', '?')}" + (f" ({', '.join(details)})" if details else "")


def format_task(task):  # type: ignore[no-untyped-def]  # Flower option: called on a copy of each task
    """Mask tokens and secret-shaped text in the args, kwargs and result Flower shows; a Cairn job's args
    as one short line (:func:`_cairn_job_line`)."""
    if getattr(task, "name", None) == CAIRN_JOB_TASK and isinstance(getattr(task, "args", None), str):
        task.args = _cairn_job_line(task.args)
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

# --- metrics ------------------------------------------------------------------------
# /metrics gains the queue lengths Flower lacks: switchyard_queue_messages{queue=…} and two more
# (tasks.queue_metrics; docs/operations.md section 5).
_queue_metrics.install()
