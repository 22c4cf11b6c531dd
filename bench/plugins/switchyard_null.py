"""``null``: a Cairn provider and a transcription engine whose own work takes no time (issue 15 §4).

The capacity bench (``bench/capacity.py``) asks how far the fleet's own machinery
goes: one bridge, one Redis, the Celery hops, the contract's wire work. Real work
(a Strava call, a whisper pass) would hide that, so both sides run a plug-in that
answers at once:

* :class:`NullProvider` (``CAIRN_PROVIDER=null``): ``fetch_source`` returns one
  activity built from the job, without a call or a raw archive; the fleet still
  gets the job's tokens from core, publishes the claim-checked result and acks.
* :class:`NullEngine` (``VOICY_WORKER_TRANSCRIBER=null``): one segment, no model;
  the fleet still claims, downloads the media from Telegram, posts ``progress``
  and ``result``.

They plug in the way a third party's would: this module is installed as its own
distribution (``devstack.infra.plugins``) with entry points in the
``switchyard.providers`` and ``switchyard.engines`` groups, and no Switchyard
module names it. It imports only Switchyard's plug-in interfaces.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from workers.providers.base import Provider
from workers.providers.context import ProviderContext
from workers.providers.errors import ProviderPermanentError
from workers.providers.kinds import FETCH_SOURCE
from workers.providers.models import ActivityRef, Capabilities, DiscoverReply, DiscoverRequest, FetchJob, FetchOutcome
from workers.providers.windows import RateWindow
from workers.transcribe.results import EngineInfo, Segment, Transcript

NAME = "null"
DISTRIBUTION = "switchyard-null"
VERSION = "0.1.0"
MODULE = "switchyard_null"
PROVIDER_ENTRY = f"{MODULE}:NullProvider"
ENGINE_ENTRY = f"{MODULE}:NullEngine"
DATASET_VERSION = 1
PARSER_VERSION = "1.0"
ACTIVITY_START = "2026-07-01T06:00:00Z"
ACTIVITY_SECONDS = 1800
TRANSCRIPT_TEXT = "null"
TRANSCRIPT_SECONDS = 1.0
HTTP_TIMEOUT_S = 5.0


class NullProvider(Provider):
    """Imports one activity per ``fetch_source`` job, made from the job alone."""

    name = NAME
    dataset_version = DATASET_VERSION
    parser_version = PARSER_VERSION

    def declared_capabilities(self) -> Capabilities:
        return Capabilities(jobs=frozenset({FETCH_SOURCE}), data_types={"Activity": {"read": True}})

    def manifest_meta(self) -> dict[str, Any] | None:
        return None

    def rate_windows(self) -> Sequence[RateWindow]:
        return ()  # it calls no API, so it spends no budget

    def new_http_client(self) -> httpx.Client:
        return httpx.Client(timeout=HTTP_TIMEOUT_S)  # never used

    def fetch_source(self, ctx: ProviderContext, job: FetchJob) -> FetchOutcome:
        ref = {"userId": job.user_id, "provider": NAME, "externalAccountId": job.account_id,
               "externalId": str(job.ext_id)}
        payload = {"type": "ACTIVITY_TYPE_RUN", "providerNativeType": "run", "title": f"null {job.ext_id}",
                   "startTime": ACTIVITY_START, "elapsedDuration": f"{ACTIVITY_SECONDS}s"}
        return FetchOutcome(ext_id=str(job.ext_id),
                            wire_events=[{"type": "WORKER_EVENT_TYPE_ACTIVITY", "activity": {"ref": ref,
                                                                                             "payload": payload}}])

    def parse_blob(self, raw: bytes, job: FetchJob) -> FetchOutcome:
        raise ProviderPermanentError("the null provider archives nothing to parse", code="unsupported_dataset")

    def list_activities(self, ctx: ProviderContext, after: datetime | None, before: datetime | None = None,
                        limit: int | None = None, exclude: Collection[str] = ()) -> list[ActivityRef]:
        return []

    def discover(self, ctx: ProviderContext, request: DiscoverRequest) -> DiscoverReply:
        return DiscoverReply(items=[], complete=True)


class NullEngine:
    """One fixed segment for any media, at once (``TranscriptionEngine``)."""

    name = NAME

    def __init__(self, settings: Any, pool_processes: int = 1) -> None:
        self._settings = settings

    @property
    def metadata(self) -> EngineInfo:
        return EngineInfo(model=NAME, device="cpu", compute_type="none")

    def transcribe(self, path: Path, language: str | None = None, on_segment: Any = None) -> Transcript:
        transcript = Transcript(segments=[Segment(0.0, TRANSCRIPT_SECONDS, TRANSCRIPT_TEXT)],
                                language=language or "en", duration=TRANSCRIPT_SECONDS)
        if on_segment is not None:
            on_segment(transcript)
        return transcript
