"""Activity photos mirrored as attachments (issue 10 §3; reference §3.6 step 8, §1.8) against real services.

The fake Strava serves the photo listing as an API call (auth, budget, usage
headers) and the bytes from a CDN route (no auth, no budget), with photos that
are large, oversize, failing or served without a Content-Type. The dev core
presigns the uploads to moto S3 under the user's layout and ingests strictly.
Nothing of ours is mocked.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import httpx
import pytest
from google.protobuf import json_format

from devstack.fakes.cairn_core import DevCairnCore
from devstack.fakes.strava import FakeStrava
from devstack.fakes.strava.media import image_bytes
from tests.kit.cairn_ctx import Athlete, RecordingHook, admit_and_run, ingested_since
from workers.cairn.claimcheck import UserBlobSink
from workers.cairn.contract import wire
from workers.cairn.contract.pb.cairn.worker.v1 import worker_pb2 as pb
from workers.cairn.handlers import JobContext
from workers.providers.context import ProviderContext
from workers.providers.strava.dataset import PARSER_VERSION
from workers.providers.strava.photos import (
    MAX_PHOTO_BYTES,
    PhotoError,
    content_type_of,
    download,
    largest_size,
    may_have_photos,
    sniff,
)


def photo_activity(strava: FakeStrava, ath: Athlete) -> tuple[int, int]:
    """(index, id) of an activity without segment efforts: photos alone decide its outcome."""
    acts = strava.athlete(ath.id).activities
    i, aid = next((i, aid) for i, aid in enumerate(sorted(acts)) if not acts[aid]["segment_efforts"])
    return i, aid


def attachments_of(record: Any) -> list[dict[str, Any]]:
    return record.data["events"][-1]["activity"].get("attachments", [])


def user_objects(core: DevCairnCore, ath: Athlete) -> list[str]:
    return core.blobs.keys(f"users/{ath.user_id}/strava/")


# --------------------------------------------------------------------------- pure pieces


def test_largest_size_sniffing_and_the_no_photo_shortcut() -> None:
    assert largest_size({"100": "u100", "600": "u600", "2048": "u2048"}) == ("2048", "u2048")
    assert largest_size({"100": "u100", "600": "", "x": "ux"}) == ("100", "u100")
    assert largest_size({}) is None
    assert sniff(b"\xff\xd8\xff\xe0rest") == "image/jpeg" and sniff(b"\x89PNG\r\n\x1a\nrest") == "image/png"
    assert sniff(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "image/webp"
    assert sniff(b"\x00\x00\x00\x18ftypheic") == "image/heic" and sniff(b"hello") is None
    assert content_type_of("image/jpeg; charset=binary", b"") == "image/jpeg"
    assert content_type_of("application/octet-stream", b"\x89PNG\r\n\x1a\n") == "image/png"
    assert content_type_of("", b"???") == "application/octet-stream"
    assert not may_have_photos({"total_photo_count": 0, "photos": {"primary": None, "count": 0}})
    assert may_have_photos({"total_photo_count": 2, "photos": {"primary": None, "count": 0}})
    assert may_have_photos({"id": 1})  # counts unknown: ask, as the published worker always does


def test_download_is_bounded_before_and_while_reading(strava: FakeStrava) -> None:
    ath = strava.add_athlete(4301, n_activities=1)
    aid = next(iter(ath.activities))
    photo = strava.add_photo(4301, aid)
    url = strava.cdn_url(photo, 2048)
    with httpx.Client(timeout=10.0) as http:
        body, header = download(http, url)
        assert body == image_bytes(photo, 2048) and header == "image/jpeg"
        with pytest.raises(PhotoError, match="over the 100-byte bound"):  # declared Content-Length
            download(http, url, max_bytes=100)
        with pytest.raises(PhotoError, match="neither https nor loopback"):
            download(http, "http://169.254.169.254/latest/meta-data")
        with pytest.raises(PhotoError, match="neither https nor loopback"):
            download(http, "file:///etc/passwd")
    assert MAX_PHOTO_BYTES == 32 * 1024 * 1024


def test_the_fake_serves_photos_like_strava(strava: FakeStrava) -> None:
    """The listing is an API call (auth, usage headers, ``size`` honoured); the CDN is not."""
    ath = strava.add_athlete(4302, n_activities=1)
    aid = next(iter(ath.activities))
    photo = strava.add_photo(4302, aid, caption="c", native=(800, 600))
    api = f"{strava.api_url}/activities/{aid}/photos"
    auth = {"Authorization": f"Bearer {ath.access_token}"}
    with httpx.Client(timeout=10.0) as http:
        assert http.get(api, params={"size": 2048}).status_code == 401
        listed = http.get(api, params={"size": 2048, "photo_sources": "true"}, headers=auth)
        assert listed.status_code == 200 and "X-ReadRateLimit-Usage" in listed.headers
        [entry] = listed.json()
        assert entry["sizes"] == {"2048": [800, 600]}  # never upscaled
        assert list(http.get(api, headers=auth).json()[0]["urls"]) == ["100"]  # the thumbnail by default
        assert http.get(f"{strava.api_url}/activities/1/photos", headers=auth).status_code == 404
        detail = http.get(f"{strava.api_url}/activities/{aid}", headers=auth).json()
        assert detail["total_photo_count"] == 1 and sorted(detail["photos"]["primary"]["urls"]) == ["100", "600"]
        cdn = http.get(entry["urls"]["2048"])  # no token
        assert cdn.status_code == 200 and "X-ReadRateLimit-Usage" not in cdn.headers
        assert cdn.content == image_bytes(photo, 2048)


# --------------------------------------------------------------------------- handlers vs dev core


def test_several_photos_are_mirrored_with_their_largest_size_and_reparse_identically(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, pool: str) -> None:
    ath = Athlete(core, strava, pool, n=6)
    i, aid = photo_activity(strava, ath)
    jpeg = strava.add_photo(ath.id, aid, caption="Summit", native=(4032, 3024))
    png = strava.add_photo(ath.id, aid, content_type="image/png", header_type="", native=(1000, 3000))
    strava.clear_requests()
    before, cdn_auth = len(core.ingested), strava.cdn_with_authorization
    job = ath.fetch_job(i)
    assert admit_and_run(ctx, "fetch_source", job, 1).action == "ack"
    [imported] = ingested_since(core, before)
    [listing] = [r for r in strava.requests if r.endpoint == "photos"]
    assert listing.query == {"size": "2048", "photo_sources": "true"} and listing.athlete_id == ath.id
    cdn = [r for r in strava.requests if r.endpoint == "cdn"]
    assert len(cdn) == 2 and all(".2048." in r.path for r in cdn)
    assert strava.cdn_with_authorization == cdn_auth  # the token never goes to the CDN
    first, second = attachments_of(imported)
    prefix = f"users/{ath.user_id}/strava/"
    assert first["blobId"].startswith(prefix) and second["blobId"].startswith(prefix)
    assert (first["contentType"], first["caption"], first["width"], first["height"]) == \
        ("image/jpeg", "Summit", 2048, 1536)
    assert first["externalUrl"] == strava.cdn_url(jpeg, 2048)
    assert (second["contentType"], second["width"], second["height"]) == ("image/png", 683, 2048)  # sniffed
    assert "caption" not in second
    assert core.blobs.get(first["blobId"]) == image_bytes(jpeg, 2048)
    assert core.blobs.get(second["blobId"]) == image_bytes(png, 2048)
    assert core.blobs.head(second["blobId"])["ContentType"] == "image/png"  # type: ignore[index]
    raw_key = imported.data["events"][-1]["activity"]["rawBlobId"]
    archived = json.loads(core.blobs.get(raw_key) or b"{}")["photos"]
    assert [p["mirror"]["blob_id"] for p in archived] == [first["blobId"], second["blobId"]]
    # parse parity: the archive alone yields the same attachments, byte for byte
    reparse = dict(job, job_id=f"reparse:{uuid.uuid4()}", min_parser_version=PARSER_VERSION,
                   blob={"url": core.blobs.presign_download(raw_key)["url"],
                         "expires_at": "2099-01-01T00:00:00Z", "fallback_handle": raw_key})
    strava.clear_requests()
    before = len(core.ingested)
    assert admit_and_run(ctx, "parse_blob", reparse, 1).action == "ack"
    [reparsed] = ingested_since(core, before)
    assert wire.encode_result(reparsed.result) == wire.encode_result(imported.result)
    assert strava.requests == []  # quota-free: no API call, no download


@pytest.mark.parametrize("listing_status", [500, 429])
def test_a_failed_listing_falls_back_to_the_primary_photo(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, pool: str, listing_status: int) -> None:
    ath = Athlete(core, strava, pool, n=6)
    i, aid = photo_activity(strava, ath)
    primary = strava.add_photo(ath.id, aid, caption="not in the detail")
    strava.add_photo(ath.id, aid)
    strava.fail("photos", listing_status)
    strava.clear_requests()
    before = len(core.ingested)
    disposition = admit_and_run(ctx, "fetch_source", ath.fetch_job(i), 1)
    assert disposition.action == "ack", disposition  # a photo never delays the activity, a 429 neither
    [imported] = ingested_since(core, before)
    [attachment] = attachments_of(imported)
    assert attachment["externalUrl"] == strava.cdn_url(primary, 600)  # the largest of 100 and 600
    assert attachment["contentType"] == "image/jpeg" and "width" not in attachment
    assert "caption" not in attachment  # the detail's primary photo carries none
    assert core.blobs.get(attachment["blobId"]) == image_bytes(primary, 600)


def test_an_empty_listing_falls_back_and_a_photo_less_activity_costs_no_call(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, pool: str) -> None:
    ath = Athlete(core, strava, pool, n=6)
    i, aid = photo_activity(strava, ath)
    strava.clear_requests()
    before = len(core.ingested)
    plain_disposition = admit_and_run(ctx, "fetch_source", ath.fetch_job(i), 1)
    assert plain_disposition.action == "ack", plain_disposition
    [plain] = ingested_since(core, before)
    assert "attachments" not in plain.data["events"][-1]["activity"]
    assert not [r for r in strava.requests if r.endpoint == "photos"]  # the detail says: no photos
    # A detail that announces a photo the listing does not return (e.g. an Instagram one): primary.
    primary = strava.add_photo(ath.id, aid, listed=False)
    before = len(core.ingested)
    assert admit_and_run(ctx, "fetch_source", ath.fetch_job(i), 1).action == "ack"
    [imported] = ingested_since(core, before)
    assert [a["externalUrl"] for a in attachments_of(imported)] == [strava.cdn_url(primary, 600)]


def test_oversize_and_failing_downloads_are_skipped_and_the_rest_imported(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, pool: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="workers")
    ath = Athlete(core, strava, pool, n=6)
    i, aid = photo_activity(strava, ath)
    strava.add_photo(ath.id, aid, oversize_bytes=MAX_PHOTO_BYTES + 1)  # streamed, no Content-Length
    strava.add_photo(ath.id, aid, fail_status=403)  # CloudFront AccessDenied
    good = strava.add_photo(ath.id, aid, caption="kept")
    strava.add_photo(ath.id, aid, fail_status=503)
    before = len(core.ingested)
    disposition = admit_and_run(ctx, "fetch_source", ath.fetch_job(i), 1)
    assert disposition.action == "ack", disposition
    [imported] = ingested_since(core, before)
    [attachment] = attachments_of(imported)
    assert attachment["caption"] == "kept" and core.blobs.get(attachment["blobId"]) == image_bytes(good, 2048)
    raw_key = imported.data["events"][-1]["activity"]["rawBlobId"]
    assert user_objects(core, ath) == sorted([raw_key, attachment["blobId"]])  # nothing else uploaded
    archived = json.loads(core.blobs.get(raw_key) or b"{}")["photos"]
    assert [("mirror" in p) for p in archived] == [False, False, True, False]  # metadata of all four kept
    assert caplog.text.count("not mirrored") == 3 and "bound" in caplog.text and "HTTP 403" in caplog.text
    assert ath.fake.access_token not in caplog.text and "/cdn/photos/" not in caplog.text


def test_a_failed_photo_upload_never_fails_the_activity(core: DevCairnCore, ctx: JobContext,
                                                        strava: FakeStrava, pool: str) -> None:
    ath = Athlete(core, strava, pool, n=6)
    i, aid = photo_activity(strava, ath)
    strava.add_photo(ath.id, aid)
    core.inject_fault("presign_upload", {"error": "s3 unavailable"})  # the photo's presign fails
    before = len(core.ingested)
    assert admit_and_run(ctx, "fetch_source", ath.fetch_job(i), 1).action == "ack"
    [imported] = ingested_since(core, before)
    assert "attachments" not in imported.data["events"][-1]["activity"]
    assert imported.data["events"][-1]["activity"]["rawBlobId"]  # the archive went up all the same


def test_the_listing_reserves_budget_and_a_denied_one_falls_back(core: DevCairnCore, ctx: JobContext,
                                                                 strava: FakeStrava, pool: str) -> None:
    ath = Athlete(core, strava, pool, n=6)
    i, aid = photo_activity(strava, ath)
    primary = strava.add_photo(ath.id, aid)
    provider = ctx.provider
    job = type("Job", (), {"user_id": ath.user_id, "account_id": ath.account_id, "ext_id": str(aid),
                           "fetch_streams": True})()
    gear = 1 if strava.athlete(ath.id).activities[aid].get("gear_id") else 0
    hook = RecordingHook()
    out = provider.fetch_source(ProviderContext(access_token=ath.fake.access_token, http=ctx.http,
                                                rate_limit=hook, blobs=UserBlobSink(ctx.claimcheck)), job)
    assert len(hook.reserved) == 3 + gear  # activity, streams, (gear), photos: every API call
    assert len(out.activity["attachments"]) == 1
    strava.clear_requests()
    denied = RecordingHook(deny_after=2)  # activity, streams (gear cached); the listing is refused
    out = provider.fetch_source(ProviderContext(access_token=ath.fake.access_token, http=ctx.http,
                                                rate_limit=denied, blobs=UserBlobSink(ctx.claimcheck)), job)
    assert out.rate_limited is None and not [r for r in strava.requests if r.endpoint == "photos"]
    assert [a["externalUrl"] for a in out.activity["attachments"]] == [strava.cdn_url(primary, 600)]


def test_a_rerun_reuses_the_mirrored_photo_instead_of_storing_it_again(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, pool: str) -> None:
    """A job NAKed for its segments re-runs the whole fetch: the photo must not pile up in S3."""
    ath = Athlete(core, strava, pool, n=6)
    i, aid = photo_activity(strava, ath)
    strava.add_photo(ath.id, aid)
    strava.clear_requests()
    blobs = []
    for attempt in (1, 2):
        before = len(core.ingested)
        assert admit_and_run(ctx, "fetch_source", ath.fetch_job(i), attempt).action == "ack"
        [imported] = ingested_since(core, before)
        blobs += [a["blobId"] for a in attachments_of(imported)]
    assert len(blobs) == 2 and blobs[0] == blobs[1]
    assert len([r for r in strava.requests if r.endpoint == "cdn"]) == 1
    assert len([r for r in strava.requests if r.endpoint == "photos"]) == 2  # the listing is fresh
    assert sum(1 for k in user_objects(core, ath) if k in blobs) == 1


def test_the_dev_core_refuses_an_attachment_outside_the_users_layout(
        core: DevCairnCore, ctx: JobContext, strava: FakeStrava, pool: str) -> None:
    """Contract §5: core refuses blob keys outside ``users/<user>/<provider>/…`` (and ``shared/``)."""
    ath = Athlete(core, strava, pool, n=6)
    i, aid = photo_activity(strava, ath)
    strava.add_photo(ath.id, aid)
    before = len(core.ingested)
    assert admit_and_run(ctx, "fetch_source", ath.fetch_job(i), 1).action == "ack"
    [imported] = ingested_since(core, before)
    for foreign in (f"users/{uuid.uuid4()}/strava/uploads/x", "users/u/garmin/uploads/x"):
        body = imported.data
        body["events"][-1]["activity"]["attachments"][0]["blobId"] = foreign
        for stamp in ("workerName", "workerVersion", "workerPackage"):
            body.pop(stamp, None)
        result = json_format.ParseDict(body, pb.JobResult())
        rejected = len(core.rejected)
        ctx.claimcheck.publish_claim_checked(imported.subject, result, f"result:forged-{uuid.uuid4()}:d1")
        [rejection] = core.wait_for_rejected(rejected + 1)[rejected:]
        assert rejection.reason == "foreign_attachment_key", rejection
