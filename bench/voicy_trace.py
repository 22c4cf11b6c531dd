"""Where a Voicy job's time goes, from the outside: request spans at the fakes and Celery task events.

Nothing in the fleet is instrumented for this. Two sources, both on this
host's wall clock (``time.time``), give every step from claim to result:

* :class:`RequestClock`, ASGI middleware in front of the dev Voicy API and
  the fake Telegram, records when each request arrived and when its response
  was sent (:class:`TimedVoicyServer`, :class:`TimedTelegram`);
* :class:`TaskEvents` listens to the workers' own Celery events (the
  Procfile runs them with ``-E``): ``task-sent`` (by the process that sends
  the task), ``task-received`` and ``task-started`` (the worker taking it and
  handing it to a pool process), ``task-succeeded``.

:func:`timeline` lays one job's spans end to end; the gap between two spans
is the fleet's own work in between (a Redis transaction, the broker hop, the
store write), named after what it holds. ``bench.voicy_costs`` turns many
timelines into the per-job cost table.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from celery import Celery

from devstack.fakes.http_server import BackgroundServer
from devstack.fakes.telegram import FakeTelegram
from devstack.fakes.voicy_api import DevVoicyServer
from devstack.fakes.voicy_api.app import build_app

JOB_PATH_RE = re.compile(r"/jobs/([0-9a-f]{24})(?:/([a-z-]+))?$")
ID_RE = re.compile(r"[0-9a-f]{24}")
RESPONSE_PREFIX_BYTES = 512
ARGS_JOB_RE = re.compile(r"'([0-9a-f]{24})'")
EVENTS_READY_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Span:
    """One request at a fake: what, for which job (if any), arrival and response times (epoch s)."""

    name: str
    job_id: str | None
    start: float
    end: float


class RequestClock:
    """ASGI middleware: a :class:`Span` per HTTP request, named by ``namer(method, path, query, body)``.

    ``body`` is the start of the response (``RESPONSE_PREFIX_BYTES``): a claim's
    path names no job, its answer does.
    """

    def __init__(self, app: Any, namer: Any) -> None:
        self.app, self.namer = app, namer
        self.spans: list[Span] = []
        self._lock = threading.Condition()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.time()
        head = bytearray()

        async def keep_head(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and len(head) < RESPONSE_PREFIX_BYTES:
                head.extend(message.get("body", b"")[:RESPONSE_PREFIX_BYTES - len(head)])
            await send(message)

        await self.app(scope, receive, keep_head)
        ended = time.time()
        name, job_id = self.namer(scope["method"], scope["path"], scope.get("query_string", b"").decode(),
                                  bytes(head).decode("utf-8", "replace"))
        with self._lock:
            self.spans.append(Span(name, job_id, started, ended))
            self._lock.notify_all()

    def take(self) -> list[Span]:
        with self._lock:
            return list(self.spans)

    def wait_for_calls(self, names: set[str], job_ids: set[str], timeout_s: float) -> set[str]:
        """Block until every job in ``job_ids`` had a call named in ``names`` answered (or the timeout);
        returns the jobs still without one. Woken by each request, so the bench polls nothing."""
        def missing() -> set[str]:
            return job_ids - {s.job_id for s in self.spans if s.name in names and s.job_id}

        with self._lock:
            self._lock.wait_for(lambda: not missing(), timeout_s)
            return missing()


def voicy_name(method: str, path: str, query: str, body: str) -> tuple[str, str | None]:
    """``POST …/jobs/<id>/result`` → ``("result", id)``; a claim → ``("claim-download", <the job it gave>)``."""
    match = JOB_PATH_RE.search(path)
    if match:
        return match.group(2) or "job", match.group(1)
    answered = ID_RE.search(body)
    return path.rsplit("/", 1)[-1], answered.group(0) if answered else None


def telegram_name(method: str, path: str, query: str, body: str) -> tuple[str, str | None]:
    """Telegram spans carry the *file* id: ``getFile`` from its query, a download from its path."""
    if path.endswith("/getFile"):
        return "getFile", parse_qs(query).get("file_id", [None])[0]
    return "download", path.rsplit("/", 1)[-1].rsplit(".", 1)[0]


class TimedVoicyServer(DevVoicyServer):
    """The dev Voicy API with a :class:`RequestClock` in front."""

    def start(self) -> TimedVoicyServer:
        self.clock = RequestClock(build_app(self.state), voicy_name)
        self.http = BackgroundServer(self.clock, "dev-voicy", self.port).start()
        return self


class TimedTelegram(FakeTelegram):
    """The fake Telegram with a :class:`RequestClock` in front; spans name the file id, not the job."""

    def app(self) -> Any:
        self.clock = RequestClock(super().app(), telegram_name)
        return self.clock

    def add_voice(self, file_id: str, data: bytes) -> str:
        """A voice file whose download path names its file id (so its spans can be told apart)."""
        return self.add_file(file_id, data, path=f"voice/{file_id}.oga")


@dataclass(frozen=True)
class TaskEvent:
    kind: str  # task-sent, task-received, task-started, task-succeeded, task-failed
    task: str  # voicy.download, voicy.transcribe
    uuid: str
    job_id: str | None
    at: float
    hostname: str


class TaskEvents:
    """The fleet's Celery task events, captured by a receiver thread on the broker."""

    def __init__(self, broker_url: str) -> None:
        self.app = Celery("bench-events", broker=broker_url)
        self.events: list[TaskEvent] = []
        self._names: dict[str, tuple[str, str | None]] = {}  # uuid → (task name, job id)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-task-events", daemon=True)

    def start(self) -> TaskEvents:
        self._thread.start()
        if not self._ready.wait(EVENTS_READY_TIMEOUT_S):
            raise RuntimeError("the Celery event receiver did not connect")
        return self

    def _run(self) -> None:
        try:
            with self.app.connection() as conn:
                receiver = self.app.events.Receiver(conn, handlers={"*": self._on_event})
                self._ready.set()
                for _ in receiver.itercapture(limit=None, timeout=None, wakeup=False):
                    if self._stop.is_set():
                        return
        except Exception:  # Redis stopped under the receiver at the end of a run
            if not self._stop.is_set():
                raise

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type", "")
        if not kind.startswith("task-"):
            return
        uuid = event.get("uuid", "")
        with self._lock:
            if "name" in event:  # task-sent and task-received carry the name and arguments
                job = ARGS_JOB_RE.search(str(event.get("args", "")))
                self._names[uuid] = (event["name"], job.group(1) if job else None)
            name, job_id = self._names.get(uuid, ("?", None))
            self.events.append(TaskEvent(kind, name, uuid, job_id, float(event.get("timestamp", 0.0)),
                                         event.get("hostname", "")))

    def take(self) -> list[TaskEvent]:
        with self._lock:
            named = [TaskEvent(e.kind, self._names.get(e.uuid, (e.task, e.job_id))[0],
                               e.uuid, self._names.get(e.uuid, (e.task, e.job_id))[1], e.at, e.hostname)
                     for e in self.events]
        return sorted(named, key=lambda e: e.at)

    def stop(self) -> None:
        self._stop.set()


def timeline(job_id: str, file_id: str, voicy: list[Span], telegram: list[Span],
             events: list[TaskEvent]) -> list[Span]:
    """One job's spans in time order: its Voicy calls, its Telegram calls, its tasks' events (as points)."""
    own = [s for s in voicy if s.job_id == job_id]
    own += [Span(s.name, job_id, s.start, s.end) for s in telegram if s.job_id == file_id]
    own += [Span(f"{e.task}:{e.kind}", job_id, e.at, e.at) for e in events if e.job_id == job_id]
    return sorted(own, key=lambda s: (s.start, s.end))
