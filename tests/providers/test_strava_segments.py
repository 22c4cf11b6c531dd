"""Segments and segment efforts (issue 10 §2; reference §3.6 step 9, §4.6) against real services.

The provider runs against the fake Strava (devstack/fakes/strava/); the
handler tests add nats-server with JetStream, moto S3, Redis and the dev core,
which ingests strictly (protojson with unknown fields rejected, claim-check
verified) and resolves every effort against its segment and activity source as
core does. Nothing of ours is mocked.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import pytest

from devstack.fakes.cairn_core import DevCairnCore
from devstack.fakes.strava import FakeStrava
from tests.kit.cairn_ctx import (
    Athlete,
    RecordingHook,
    admit_and_run,
    assert_naks_until_the_short_window,
    forget_budget,
    ingested_since,
    segments_since,
)
from workers.cairn.contract import wire
from workers.cairn.handlers import Delivery, JobContext
from workers.cairn.presence import manifest_record, presence_record
from workers.cairn.settings import CairnSettings
from workers.providers.context import ProviderContext
from workers.providers.models import PoolIdentity
from workers.providers.strava.dataset import PARSER_VERSION, build_archive, parse_dataset
from workers.providers.strava.models import StravaSegment, StravaSegmentEffort
from workers.providers.strava.provider import StravaProvider
from workers.providers.strava.segments import (
    SEGMENT_CACHE_MAX_ENTRIES,
    SEGMENT_CACHE_TTL_S,
    SegmentCache,
    map_effort,
    map_segment,
)
from workers.providers.strava.settings import StravaSettings

USER_ID = "7d1d9a8e-7a57-4a53-9b1e-1f0c0d7a0011"
ACCOUNT_ID = "0b6c2f0e-3c1a-4f5e-8a55-2a3f7d9e0012"
SEGMENT = "WORKER_EVENT_TYPE_SEGMENT"
EFFORT = "WORKER_EVENT_TYPE_SEGMENT_EFFORT"


@dataclass
class Job:
    user_id: str = USER_ID
    account_id: str = ACCOUNT_ID
    ext_id: str = ""
    fetch_streams: bool = True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10.0) as client:
        yield client


def ride_with_segments(strava: FakeStrava, athlete_id: int, **kwargs: object) -> tuple[int, list[int]]:
    """The athlete's first activity (a Ride) with efforts on three new segments: the second has no
    polyline, the first is ridden twice (four efforts)."""
    aid = sorted(strava.athlete(athlete_id).activities)[0]
    order = strava.add_segment_efforts(athlete_id, aid, 3, without_polyline=(1,), repeat_first=True, **kwargs)
    return aid, order


def segment_calls(strava: FakeStrava) -> list[tuple[str, int]]:
    return [(r.path.rsplit("/", 1)[-1], r.status) for r in strava.requests if r.endpoint == "segment"]


# --------------------------------------------------------------------------- mapping (§4.6)


@pytest.mark.parametrize(("category", "expected"), [(0, "NONE"), (1, "FOUR"), (2, "THREE"), (3, "TWO"),
                                                    (4, "ONE"), (5, "HORS_CATEGORIE"), (9, "NONE")])
def test_climb_category_is_always_set(category: int, expected: str) -> None:
    segment = StravaSegment.model_validate({"id": 1, "climb_category": category, "map": {"polyline": "abc"}})
    assert map_segment(segment)["climbCategory"] == f"CLIMB_CATEGORY_{expected}"  # type: ignore[index]


def test_segment_and_effort_mapping_follows_the_reference() -> None:
    detail = {"id": 5, "name": "Col", "activity_type": "run", "distance": 1234.5, "average_grade": -2.5,
              "maximum_grade": 0, "total_elevation_gain": 0, "climb_category": 3, "starred": True,
              "map": {"polyline": "}_ilFjk~uO"}}
    assert map_segment(StravaSegment.model_validate(detail)) == {
        "name": "Col", "activityType": "ACTIVITY_TYPE_RUN", "encodedPolyline": "}_ilFjk~uO",
        "distanceM": 1234.5, "avgGrade": -2.5, "climbCategory": "CLIMB_CATEGORY_TWO", "starred": True}
    ride = StravaSegment.model_validate({**detail, "activity_type": "Hike", "starred": False})
    assert map_segment(ride)["activityType"] == "ACTIVITY_TYPE_RIDE"  # type: ignore[index]
    assert map_segment(StravaSegment.model_validate({**detail, "map": {"polyline": None}})) is None
    effort = StravaSegmentEffort.model_validate({
        "id": 9, "start_date": "2024-05-04T06:40:00Z", "elapsed_time": 301, "moving_time": 299,
        "start_index": 120, "end_index": 400, "average_heartrate": 150.5, "max_heartrate": 171.4,
        "average_watts": None, "average_cadence": 0})
    assert map_effort(effort) == {"startTime": "2024-05-04T06:40:00Z", "elapsed": "301s", "moving": "299s",
                                  "startOffset": 120, "endOffset": 400, "avgHeartRateBpm": 151,
                                  "maxHeartRateBpm": 171}


def test_segment_cache_is_bounded_by_size_and_ttl() -> None:
    assert SEGMENT_CACHE_MAX_ENTRIES >= 1 and SEGMENT_CACHE_TTL_S > 0
    clock = Clock()
    cache = SegmentCache(max_entries=2, ttl_s=60.0, clock=clock)
    for sid in ("1", "2", "3"):
        cache.put(("acct", sid), {"id": int(sid)})
    assert len(cache) == 2 and cache.evictions == 1
    assert cache.get(("acct", "1")) is None  # least recently used went first
    assert cache.get(("acct", "2")) == {"id": 2}
    cache.put(("acct", "4"), {"id": 4})  # "2" was just used: "3" goes
    assert cache.get(("acct", "3")) is None and cache.get(("acct", "2")) is not None
    assert cache.get(("other", "2")) is None  # one athlete's copy is never another's
    clock.now += 61
    assert cache.get(("acct", "2")) is None and cache.get(("acct", "4")) is None  # expired
    assert len(cache) == 0
    with pytest.raises(ValueError):
        SegmentCache(max_entries=0)


def test_manifest_and_presence_declare_segment_and_segment_effort() -> None:
    provider = StravaProvider(StravaSettings(base_url="https://unused.example"))
    settings = CairnSettings(provider="strava", worker_name="pool-caps", worker_package="switchyard.test")
    for record in (manifest_record(settings, provider), presence_record(settings, provider, "i-1")):
        caps = record["capabilities"]
        assert caps["Segment"]["read"] is True and caps["SegmentEffort"]["read"] is True
        assert caps["Segment"]["write"] is False


# --------------------------------------------------------------------------- provider vs fake Strava


def test_fetch_emits_segments_first_skips_no_polyline_and_parses_back(strava: FakeStrava,
                                                                       http: httpx.Client) -> None:
    strava.add_athlete(3101, n_activities=2)
    aid, order = ride_with_segments(strava, 3101)
    provider = StravaProvider(StravaSettings(base_url=strava.base_url), pool=PoolIdentity("w", "p"))
    hook = RecordingHook()
    strava.clear_requests()
    out = provider.fetch_source(ProviderContext(access_token=strava.athlete(3101).access_token, http=http,
                                                rate_limit=hook), Job(ext_id=str(aid)))
    assert [e["type"] for e in out.wire_events][-1] == "WORKER_EVENT_TYPE_ACTIVITY"  # the first result
    types = [e["type"] for e in out.segment_events]
    assert types == [SEGMENT, SEGMENT, EFFORT, EFFORT, EFFORT]  # segments first; one per distinct segment
    segments = [e["segment"] for e in out.segment_events[:2]]
    assert [s["ref"]["externalId"] for s in segments] == [str(order[0]), str(order[2])]  # no polyline: skipped
    assert all(s["payload"]["encodedPolyline"] for s in segments)
    assert segments[0]["payload"]["starred"] is True and segments[0]["ref"]["externalAccountId"] == ACCOUNT_ID
    efforts = [e["segmentEffort"] for e in out.segment_events[2:]]
    act = strava.athlete(3101).activities[aid]
    expected = [str(e["id"]) for e in act["segment_efforts"] if e["segment"]["id"] != order[1]]
    assert [e["ref"]["externalId"] for e in efforts] == expected
    assert {e["activityExternalId"] for e in efforts} == {str(aid)}
    assert [e["segmentExternalId"] for e in efforts] == [str(order[0]), str(order[2]), str(order[0])]
    assert out.rate_limited is None and out.segment_errors == 0
    assert segment_calls(strava) == [(str(sid), 200) for sid in order[:3]]  # each distinct segment once
    assert len(hook.reserved) == len(hook.observed)  # every segment call reserved and synced
    envelope = json.loads(out.archive.body)  # type: ignore[union-attr]
    assert [s["id"] for s in envelope["segments"]] == order[:3]  # every input archived, polyline or not
    again = StravaProvider(StravaSettings(base_url="https://unused.example")).parse_blob(
        out.archive.body, Job(ext_id=""))  # type: ignore[union-attr]
    assert json.dumps(again.segment_events) == json.dumps(out.segment_events)
    assert [e.SerializeToString(deterministic=True) for e in out.events] == \
        [e.SerializeToString(deterministic=True) for e in again.events]
    # A re-run of the job finds the details in the (per-account) cache: no segment call at all.
    strava.clear_requests()
    rerun = provider.fetch_source(ProviderContext(access_token=strava.athlete(3101).access_token, http=http),
                                  Job(ext_id=str(aid)))
    assert segment_calls(strava) == [] and rerun.segment_events == out.segment_events
    assert provider.segment_cache.hits >= 3


def test_without_fetch_streams_no_segment_is_fetched(strava: FakeStrava, http: httpx.Client) -> None:
    strava.add_athlete(3102, n_activities=1)
    aid, _ = ride_with_segments(strava, 3102)
    provider = StravaProvider(StravaSettings(base_url=strava.base_url))
    strava.clear_requests()
    out = provider.fetch_source(ProviderContext(access_token=strava.athlete(3102).access_token, http=http),
                                Job(ext_id=str(aid), fetch_streams=False))
    assert out.segment_events == [] and segment_calls(strava) == []
    assert "segments" not in json.loads(out.archive.body)  # type: ignore[union-attr]


def test_cache_bound_holds_in_the_provider_and_failures_skip_only_their_segment(
        strava: FakeStrava, http: httpx.Client) -> None:
    strava.add_athlete(3103, n_activities=1)
    aid, order = ride_with_segments(strava, 3103)
    provider = StravaProvider(StravaSettings(base_url=strava.base_url, segment_cache_max_entries=2))
    ctx = ProviderContext(access_token=strava.athlete(3103).access_token, http=http)
    strava.fail("segment", 500, after=2)  # the third segment's detail fails: that segment is skipped
    out = provider.fetch_source(ctx, Job(ext_id=str(aid)))
    assert out.segment_errors == 1 and out.rate_limited is None
    assert [e["segment"]["ref"]["externalId"] for e in out.segment_events if "segment" in e] == [str(order[0])]
    assert len(provider.segment_cache) == 2  # two details fetched, two kept: the bound
    strava.clear_requests()
    provider.fetch_source(ctx, Job(ext_id=str(aid)))
    assert segment_calls(strava) == [(str(order[2]), 200)]  # only the failed one is asked again
    assert len(provider.segment_cache) == 2 and provider.segment_cache.evictions == 1


def test_budget_denied_inside_the_segment_loop_stops_it_without_failing(strava: FakeStrava,
                                                                        http: httpx.Client) -> None:
    strava.add_athlete(3104, n_activities=1, with_gear=False)
    aid, order = ride_with_segments(strava, 3104)
    provider = StravaProvider(StravaSettings(base_url=strava.base_url))
    strava.clear_requests()
    hook = RecordingHook(deny_after=3)  # activity, streams, first segment; the second is denied
    out = provider.fetch_source(ProviderContext(access_token=strava.athlete(3104).access_token, http=http,
                                                rate_limit=hook), Job(ext_id=str(aid)))
    assert out.rate_limited is not None and out.rate_limited.window == "short"
    assert segment_calls(strava) == [(str(order[0]), 200)]
    assert [e["type"] for e in out.segment_events] == [SEGMENT, EFFORT, EFFORT]  # what there is
    assert [s["id"] for s in json.loads(out.archive.body)["segments"]] == [order[0]]  # type: ignore[union-attr]


def test_older_archive_without_segments_yields_none() -> None:
    activity = {"id": 77, "sport_type": "Ride", "start_date": "2024-01-01T10:00:00Z", "elapsed_time": 100,
                "segment_efforts": [{"id": 1, "segment": {"id": 5, "name": "x"}, "elapsed_time": 10}]}
    parsed = parse_dataset(build_archive(activity, None, []), user_id=USER_ID, account_id=ACCOUNT_ID)
    assert parsed.segment_events == [] and [e["type"] for e in parsed.events] == ["WORKER_EVENT_TYPE_ACTIVITY"]
    broken = dict(activity, segment_efforts=["junk", {"id": "x"}, None])
    assert parse_dataset(build_archive(broken, None, []), user_id=USER_ID, account_id="").segment_events == []


# --------------------------------------------------------------------------- handlers vs dev core


def test_segment_result_follows_the_activity_and_core_resolves_every_effort(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, pool: str) -> None:
    ath = Athlete(core, strava, pool, n=2)
    aid, order = ride_with_segments(strava, ath.id)
    before = len(core.ingested)
    job = ath.fetch_job(0)
    assert admit_and_run(ctx, "fetch_source", job, Delivery(attempt=1, stream_seq=5)).action == "ack"
    [activity] = ingested_since(core, before)
    [segments] = segments_since(core, before)
    assert activity.msg_id == f"result:{job['job_id']}:d1" and activity.kind == "events"
    assert segments.msg_id == f"result:{job['job_id']}:d1:seg" and segments.kind == "segments"
    assert segments.claim_checked and core.ingested.index(activity) < core.ingested.index(segments)
    data = segments.data
    assert (data["workerName"], data["workerVersion"]) == (pool, PARSER_VERSION)
    assert [e["type"] for e in data["events"]] == [SEGMENT, SEGMENT, EFFORT, EFFORT, EFFORT]
    assert {(ath.account_id, str(s)) for s in (order[0], order[2])} <= set(core.router.segments)
    efforts = {k for k in core.router.efforts if k[0] == ath.account_id}
    assert len(efforts) == 3
    assert not [e for e in core.router.unresolved_efforts if e.ref.external_account_id == ath.account_id]


def test_429_inside_the_segment_loop_naks_until_the_window_and_the_rerun_is_cheap(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, pool: str) -> None:
    ath = Athlete(core, strava, pool, n=2)
    aid, order = ride_with_segments(strava, ath.id)
    job = ath.fetch_job(0)
    strava.clear_requests()
    strava.fail("segment", 429, after=1)  # Strava refuses the second segment's detail
    before, started = len(core.ingested), datetime.now(UTC)
    first = admit_and_run(ctx, "fetch_source", job, Delivery(attempt=1, stream_seq=11))
    assert first.action == "nak" and "rate_limited_segments" in first.reason
    assert_naks_until_the_short_window(first.delay_s, started, datetime.now(UTC))  # anchored to the window
    assert not first.counts_as_failure  # waiting for the window is not failing
    assert segment_calls(strava) == [(str(order[0]), 200), (str(order[1]), 429)]
    [activity] = ingested_since(core, before)  # the activity is not held back
    [partial] = segments_since(core, before)
    assert [e["type"] for e in partial.data["events"]] == [SEGMENT, EFFORT, EFFORT]
    forget_budget(ctx.nats)  # the window has passed
    strava.clear_requests()
    before = len(core.ingested)
    second = admit_and_run(ctx, "fetch_source", job, Delivery(attempt=2, stream_seq=11))
    assert second.action == "ack"
    assert segment_calls(strava) == [(str(order[1]), 200), (str(order[2]), 200)]  # the cached one is free
    [rerun] = segments_since(core, before)
    assert rerun.msg_id == f"result:{job['job_id']}:d2:seg"
    assert [e["type"] for e in rerun.data["events"]] == [SEGMENT, SEGMENT, EFFORT, EFFORT, EFFORT]


def test_parse_blob_reproduces_both_results_byte_for_byte(core: DevCairnCore, ctx: JobContext,
                                                           strava: FakeStrava, pool: str) -> None:
    ath = Athlete(core, strava, pool, n=2)
    ride_with_segments(strava, ath.id)
    job = ath.fetch_job(0)
    before = len(core.ingested)
    assert admit_and_run(ctx, "fetch_source", job, 1).action == "ack"
    [imported] = ingested_since(core, before)
    [imported_segments] = segments_since(core, before)
    raw_key = imported.data["events"][-1]["activity"]["rawBlobId"]
    archive = json.loads(core.blobs.get(raw_key) or b"{}")
    assert archive["version"] == 1 and len(archive["segments"]) == 3
    reparse = dict(job, job_id=f"reparse:{uuid.uuid4()}", min_parser_version=PARSER_VERSION,
                   blob={"url": core.blobs.presign_download(raw_key)["url"],
                         "expires_at": "2099-01-01T00:00:00Z", "fallback_handle": raw_key})
    before = len(core.ingested)
    assert admit_and_run(ctx, "parse_blob", reparse, 1).action == "ack"
    [reparsed] = ingested_since(core, before)
    [reparsed_segments] = segments_since(core, before)
    assert reparsed_segments.msg_id == f"result:{reparse['job_id']}:d1:seg"
    assert wire.encode_result(reparsed.result) == wire.encode_result(imported.result)
    assert wire.encode_result(reparsed_segments.result) == wire.encode_result(imported_segments.result)


def test_an_unmappable_activity_spends_nothing_on_segments_or_photos(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, pool: str) -> None:
    """It is termed with an envelope (contract §3 poison); its segments and photos would be wasted budget."""
    ath = Athlete(core, strava, pool, n=2)
    aid, _ = ride_with_segments(strava, ath.id)
    strava.add_photo(ath.id, aid)
    strava.patch_activity(ath.id, aid, elapsed_time=0)
    strava.clear_requests()
    disposition = admit_and_run(ctx, "fetch_source", ath.fetch_job(0), 1)
    assert disposition.action == "term" and disposition.reason.startswith("unmappable")
    assert {r.endpoint for r in strava.requests} <= {"activity", "streams", "gear"}
