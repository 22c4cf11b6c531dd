"""The argument shapes of the job tasks, read the same way by this release and the next (rolling upgrades)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Where a task says which shape its arguments follow: a keyword argument of the Voicy job tasks, an
# entry of a ``cairn.job``'s ``meta``. Absent means the first shape, the only one every release before
# this one wrote; a writer sends a newer one only once the release before it reads it (docs/operations.md §6).
SHAPE_KEY = "shape"
FIRST_SHAPE = 1
VOICY_JOB_SHAPES = frozenset({FIRST_SHAPE})  # voicy.download / voicy.transcribe: (job id, lease token)
CAIRN_JOB_SHAPES = frozenset({FIRST_SHAPE})  # cairn.job: (kind, job, meta)
CAIRN_JOB_META = ("seq", "delivery", "lease_token")  # what a job's ``meta`` must name for its run (run_job)


class ShapeRefused(ValueError):
    """A job task whose arguments this release cannot read; the text says why in one line (no token).

    ``job_id`` and ``token`` are the Voicy job's, when they could be read: the job can then be handed back.
    """

    def __init__(self, task: str, why: str, *, job_id: str | None = None, token: str | None = None) -> None:
        super().__init__(f"{task}: {why}")
        self.job_id, self.token = job_id, token


@dataclass(frozen=True)
class VoicyJobArgs:
    job_id: str
    token: str


@dataclass(frozen=True)
class CairnJobArgs:
    kind: str
    job: dict[str, Any]
    meta: dict[str, Any]


def _types(args: tuple[Any, ...]) -> str:
    """Arguments described by their types only: a lease token never reaches a log line."""
    return f"({', '.join(type(a).__name__ for a in args)})"


def _shape_known(task: str, shape: object, known: frozenset[int], **ids: str | None) -> None:
    if shape not in known:
        raise ShapeRefused(task, f"argument shape {shape!r} is not one this release reads "
                                 f"({', '.join(map(str, sorted(known)))})", **ids)


def read_voicy_job(task: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> VoicyJobArgs:
    """A Voicy job task's ``(job id, token)``; other keyword arguments are a later release's optional hints.

    Raises :class:`ShapeRefused`, carrying the job id and token when they could be read.
    """
    head = [a if isinstance(a, str) else None for a in args[:2]] + [None, None]
    job_id, token = head[0], head[1]
    _shape_known(task, kwargs.get(SHAPE_KEY, FIRST_SHAPE), VOICY_JOB_SHAPES, job_id=job_id, token=token)
    if len(args) != 2 or job_id is None or token is None:
        raise ShapeRefused(task, f"arguments {_types(args)} are not (job id, lease token)", job_id=job_id)
    return VoicyJobArgs(job_id, token)


def read_cairn_job(task: str, args: tuple[Any, ...]) -> CairnJobArgs:
    """A ``cairn.job``'s ``(kind, job, meta)``; unknown ``meta`` entries (and keywords) are optional hints."""
    if len(args) != 3 or not isinstance(args[0], str) or not isinstance(args[1], dict) \
            or not isinstance(args[2], dict):
        raise ShapeRefused(task, f"arguments {_types(args)} are not (kind, job, meta)")
    kind, job, meta = args
    _shape_known(task, meta.get(SHAPE_KEY, FIRST_SHAPE), CAIRN_JOB_SHAPES)
    missing = [name for name in CAIRN_JOB_META if name not in meta]
    if missing:
        raise ShapeRefused(task, f"meta names no {', '.join(missing)}")
    return CairnJobArgs(kind, job, meta)
