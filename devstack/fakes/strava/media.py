"""The fake Strava's photos, photo CDN and extra segment efforts (reference ``cairn.md`` §3.6, §4.1, §4.2).

What real Strava does, and so does this fake:

* ``GET /activities/{id}/photos?size=N&photo_sources=true`` (an API call:
  Bearer auth, counted, usage headers) lists the activity's photos with
  ``urls`` and ``sizes`` keyed by the requested size (the image scaled to fit
  ``N`` on its long edge; without ``size`` the 100-px thumbnail).
* The activity detail carries ``photos.primary`` (``urls`` for 100 and 600 px),
  ``photos.count`` and ``total_photo_count``.
* Photo bytes come from a CDN, not the API: no auth, no rate limit, no usage
  headers. Here the CDN is ``/cdn/photos/…`` on the same server; a photo can be
  made oversize (streamed chunked, no ``Content-Length``), failing (an HTTP
  error, as CloudFront's ``AccessDenied``), or served without a useful
  ``Content-Type`` (the worker must sniff the bytes).
* DetailedSegment (``GET /segments/{id}``) carries ``map.polyline``; some
  segments (hazardous, or very new) come back without one, which
  :meth:`MediaMixin.add_segment_efforts` can produce.

``MediaMixin`` is mixed into ``FakeStrava`` and goes through the ``_api`` plumbing of
``Endpoints``, so these endpoints count and fail like every other.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from devstack.fakes.strava.data import FakeAthlete, encode_polyline, iso_utc, start_ts
from devstack.fakes.strava.endpoints import Endpoints

CDN_PREFIX = "/cdn/photos"
PRIMARY_SIZES_PX = (100, 600)  # what ``photos.primary.urls`` offers in a DetailedActivity
THUMBNAIL_PX = 100  # the listing's size when the request names none
PHOTO_BODY_BYTES = 4096  # a generated image's size: realistic magic, small body
OVERSIZE_CHUNK_BYTES = 1024 * 1024
SEGMENT_ID_BASE = 7_000_000
ACCESS_DENIED_XML = b'<?xml version="1.0"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>'


@dataclass
class FakePhoto:
    """One photo of an activity and how the CDN serves it."""

    unique_id: str
    caption: str
    native: tuple[int, int]  # width, height of the original
    content_type: str = "image/jpeg"  # what the bytes are
    header_type: str | None = None  # the CDN's Content-Type header; None: the true type; "": none
    oversize_bytes: int = 0  # > 0: the CDN streams this many bytes, chunked
    fail_status: int = 0  # > 0: the CDN answers this status
    listed: bool = True  # False: counted in the detail but missing from the listing (e.g. Instagram)


def scaled(native: tuple[int, int], size: int) -> tuple[int, int]:
    """The dimensions Strava serves for ``size``: the long edge fitted, never upscaled."""
    w, h = native
    factor = min(1.0, size / max(w, h))
    return max(1, round(w * factor)), max(1, round(h * factor))


def _png(seed: bytes) -> bytes:
    """A real 1×1 PNG, padded with an ancillary chunk so bodies differ per photo and size."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"tEXt", b"seed\x00" + seed) + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00"))
            + chunk(b"IEND", b""))


def image_bytes(photo: FakePhoto, size: int) -> bytes:
    """Deterministic bytes for one size of a photo, with the real magic of its type."""
    seed = f"{photo.unique_id}:{size}".encode()
    if photo.content_type == "image/png":
        return _png(seed)
    filler = hashlib.sha256(seed).digest() * (PHOTO_BODY_BYTES // 32)
    return b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00" + filler + b"\xff\xd9"


class MediaMixin(Endpoints):
    """Photos, the CDN and segment efforts for ``FakeStrava`` (which provides the plumbing)."""

    cdn_with_authorization = 0  # CDN requests that carried an Authorization header (must stay 0)

    @property
    def base_url(self) -> str:
        raise NotImplementedError  # FakeStrava's, once it serves

    # ---- test control ----------------------------------------------------------------------
    def add_photo(self, athlete_id: int, activity_id: int, *, caption: str = "",
                  native: tuple[int, int] = (4032, 3024), content_type: str = "image/jpeg",
                  header_type: str | None = None, oversize_bytes: int = 0, fail_status: int = 0,
                  listed: bool = True) -> FakePhoto:
        """Attach a photo to an activity; the first one becomes the detail's primary photo."""
        with self._lock:
            ath = self._athletes[athlete_id]
            photos = ath.photos.setdefault(activity_id, [])
            photo = FakePhoto(f"{activity_id:x}-{len(photos) + 1:04d}", caption, native, content_type,
                              header_type, oversize_bytes, fail_status, listed)
            photos.append(photo)
            act = ath.activities[activity_id]
            first = photos[0]
            act["photos"] = {"primary": {"id": None, "unique_id": first.unique_id, "source": 1, "media_type": 1,
                                         "urls": {str(s): self.cdn_url(first, s) for s in PRIMARY_SIZES_PX}},
                             "use_primary_photo": True, "count": len(photos)}
            act["total_photo_count"] = len(photos)
            return photo

    def add_segment_efforts(self, athlete_id: int, activity_id: int, n_segments: int, *,
                            without_polyline: tuple[int, ...] = (), repeat_first: bool = False) -> list[int]:
        """Give an activity efforts on ``n_segments`` new segments (replacing its efforts).

        Segment ``k`` in ``without_polyline`` has no ``map.polyline`` in its detail;
        ``repeat_first`` adds a second effort on the first segment (a lap ridden twice).
        Returns the segment ids in effort order.
        """
        with self._lock:
            ath = self._athletes[athlete_id]
            act = ath.activities[activity_id]
            start = start_ts(act)
            elapsed = int(act.get("elapsed_time") or 3600)
            ids, efforts = [], []
            for k in range(n_segments):
                sid = SEGMENT_ID_BASE + (athlete_id % 1000) * 1000 + (activity_id % 100) * 10 + k
                lat0, lon0 = 46.0 + k * 0.01, 7.0 + (activity_id % 50) * 0.01
                points = [[lat0 + j * 0.001, lon0 + j * 0.0005] for j in range(12)]
                ath.segments[sid] = {
                    "id": sid, "resource_state": 3, "name": f"Segment {k}",
                    "activity_type": "Run" if k % 2 else "Ride",
                    "distance": 1200.0 + 100 * k, "average_grade": 3.5 + k, "maximum_grade": 8.0 + k,
                    "elevation_high": 600.0 + k, "elevation_low": 540.0, "climb_category": k % 7,
                    "private": False, "hazardous": k in without_polyline, "starred": k == 0,
                    "total_elevation_gain": 0.0 if k == 1 else 60.0 + k, "effort_count": 100 + k,
                    "athlete_count": 40, "star_count": 3,
                    "map": {"id": f"s{sid}", "resource_state": 3,
                            "polyline": None if k in without_polyline else encode_polyline(points)}}
                ids.append(sid)
            order = ids + ids[:1] if repeat_first and ids else ids
            for n, sid in enumerate(order):
                seg = ath.segments[sid]
                offset = min(60 * (n + 1), max(elapsed - 120, 1))
                efforts.append({
                    "id": activity_id * 1000 + 100 + n, "resource_state": 2, "name": seg["name"],
                    "activity": {"id": activity_id, "resource_state": 1},
                    "athlete": {"id": athlete_id, "resource_state": 1},
                    "elapsed_time": 95 + n, "moving_time": 90 + n, "start_date": iso_utc(start + offset),
                    "start_date_local": iso_utc(start + offset + 3600), "distance": seg["distance"],
                    "start_index": 10 * (n + 1), "end_index": 10 * (n + 1) + 8,
                    "average_heartrate": 150.5 + n, "max_heartrate": 171.0, "average_cadence": 88.4,
                    "average_watts": 250.5 if n % 2 == 0 else None, "device_watts": n % 2 == 0,
                    "pr_rank": None, "achievements": [], "hidden": False,
                    "segment": {k: v for k, v in seg.items()
                                if k not in ("map", "total_elevation_gain", "effort_count", "athlete_count",
                                             "star_count", "hazardous")}})
            act["segment_efforts"] = efforts
            return order

    def cdn_url(self, photo: FakePhoto, size: int) -> str:
        w, h = scaled(photo.native, size)
        return f"{self.base_url}{CDN_PREFIX}/{photo.unique_id}-{w}x{h}.{size}.jpg"

    # ---- endpoints -------------------------------------------------------------------------
    def _listing(self, ath: FakeAthlete, aid: int, size: int) -> list[dict[str, Any]]:
        act = ath.activities[aid]
        return [{"unique_id": p.unique_id, "athlete_id": ath.athlete_id, "activity_id": aid,
                 "activity_name": act.get("name"), "resource_state": 2, "caption": p.caption, "type": 1,
                 "source": 1, "status": 3, "uploaded_at": act.get("start_date"),
                 "created_at": act.get("start_date"), "created_at_local": act.get("start_date_local"),
                 "urls": {str(size): self.cdn_url(p, size)}, "sizes": {str(size): list(scaled(p.native, size))},
                 "default_photo": i == 0, "location": None, "post_id": None}
                for i, p in enumerate(p for p in ath.photos.get(aid, []) if p.listed)]

    async def _photos(self, request: Request) -> Response:
        aid = request.path_params["id"]
        raw = request.query_params.get("size") or ""
        size = int(raw) if raw.isdigit() and int(raw) > 0 else THUMBNAIL_PX
        return self._api(request, "photos",
                         lambda ath: (200, self._listing(ath, aid, size)) if aid in ath.activities
                         else (404, self._error_body(404, "Activity", "id")))

    def _find_photo(self, unique_id: str) -> FakePhoto | None:
        for ath in self._athletes.values():
            for photos in ath.photos.values():
                for photo in photos:
                    if photo.unique_id == unique_id:
                        return photo
        return None

    async def _cdn(self, request: Request) -> Response:
        """``/cdn/photos/<uid>-<w>x<h>.<size>.jpg``: no auth, no budget, like CloudFront."""
        name = request.path_params["name"]
        unique_id, _, rest = name.rpartition("-")
        size_text = rest.split(".")[1] if rest.count(".") == 2 else ""
        with self._lock:
            photo = self._find_photo(unique_id)
            status = 200 if photo is not None and size_text.isdigit() else 404
            if photo is not None and photo.fail_status:
                status = photo.fail_status
            self._record(request, "cdn", status, None)
            if request.headers.get("authorization"):
                self.cdn_with_authorization += 1
        if status != 200 or photo is None:
            return Response(ACCESS_DENIED_XML, status, media_type="application/xml")
        header = photo.content_type if photo.header_type is None else photo.header_type
        headers = {"Cache-Control": "max-age=31536000", "X-Cache": "Hit from cloudfront"}
        if photo.oversize_bytes:
            return StreamingResponse(_chunks(photo.oversize_bytes), 200, headers=headers,
                                     media_type=header or None)
        return Response(image_bytes(photo, int(size_text)), 200, headers=headers, media_type=header or None)

def _chunks(total: int) -> Iterator[bytes]:
    """``total`` bytes of a JPEG-looking stream, in 1-MiB chunks (no Content-Length)."""
    head = b"\xff\xd8\xff\xe0"
    yield head
    sent = len(head)
    block = b"\x00" * OVERSIZE_CHUNK_BYTES
    while sent < total:
        piece = block[: min(OVERSIZE_CHUNK_BYTES, total - sent)]
        sent += len(piece)
        yield piece
