"""Activity photos mirrored into Cairn's blob store (reference §3.6 step 8, §1.8 ``Attachment``)."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError

from workers.errors import PermanentJobError, RetryableJobError
from workers.providers.context import BlobSink
from workers.providers.errors import ProviderError
from workers.providers.strava.cache import BoundedCache
from workers.providers.strava.client import StravaClient
from workers.providers.strava.models import StravaPhoto

log = logging.getLogger(__name__)

PHOTO_LIST_SIZE_PX = 2048  # the size the listing asks for (reference §4.1)
MAX_PHOTO_BYTES = 32 * 1024 * 1024  # one download, streamed; the published worker's bound
MAX_PHOTOS_PER_ACTIVITY = 25  # bounds the time photos add to one import
PHOTO_DOWNLOAD_TIMEOUT_S = 20.0  # per photo; a slow CDN costs the photo, not the activity
DOWNLOAD_CHUNK_BYTES = 64 * 1024
MIRROR_CACHE_MAX_ENTRIES = 2048  # (user, URL) → blob id of photos mirrored lately
MIRROR_CACHE_TTL_S = 3600.0  # covers a re-run after a 15-min window; short, as core may drop blobs
FALLBACK_CONTENT_TYPE = "application/octet-stream"
SOURCE_LISTING = "photos"
SOURCE_PRIMARY = "primary"
LOOPBACK_HOSTS = frozenset({"localhost"})
# Leading bytes → content type, for a CDN answer without a useful Content-Type.
MAGIC = ((b"\xff\xd8\xff", "image/jpeg"), (b"\x89PNG\r\n\x1a\n", "image/png"), (b"GIF87a", "image/gif"),
         (b"GIF89a", "image/gif"))
ISO_BMFF_BRANDS = {b"heic": "image/heic", b"heix": "image/heic", b"mif1": "image/heif",
                   b"avif": "image/avif", b"isom": "video/mp4", b"mp42": "video/mp4", b"qt  ": "video/quicktime"}


class PhotoError(Exception):
    """One photo could not be mirrored; the message names the step, never a URL or token."""


def may_have_photos(activity: Mapping[str, Any]) -> bool:
    """False only when the detail says there are none (saves the listing call on most activities).

    Unknown counts (absent fields) are treated as "maybe", so a detail without
    them still gets the listing call the published worker always makes.
    """
    photos = activity.get("photos")
    counts = [activity.get("total_photo_count"), photos.get("count") if isinstance(photos, dict) else None]
    known = [c for c in counts if isinstance(c, int)]
    if len(known) < len(counts):
        return True
    primary = photos.get("primary") if isinstance(photos, dict) else None
    return any(c > 0 for c in known) or bool(primary)


def candidates(client: StravaClient, activity: Mapping[str, Any],
               ext_id: str) -> tuple[list[dict[str, Any]], str]:
    """(photo JSONs to mirror, their source): the listing, else the detail's primary photo.

    Best effort: a photo is decoration and may not fail or delay the activity. The listing
    reserves budget like any call; a denial, 429 or error falls back to the primary photo.
    """
    if not may_have_photos(activity):
        return [], ""
    try:
        listed = [p for p in client.get_photos(ext_id, PHOTO_LIST_SIZE_PX) if p.get("urls")]
    except ProviderError as exc:  # rate limit included: photos never wait for a window
        log.info("strava photos listing for %s skipped (%s); trying the primary photo", ext_id,
                 type(exc).__name__)
        listed = []
    if listed:
        return listed[:MAX_PHOTOS_PER_ACTIVITY], SOURCE_LISTING
    photos = activity.get("photos")
    primary = photos.get("primary") if isinstance(photos, dict) else None
    if isinstance(primary, dict) and primary.get("urls"):
        return [primary], SOURCE_PRIMARY
    return [], ""


def largest_size(urls: Mapping[str, Any]) -> tuple[str, str] | None:
    """(size key, URL) of the largest numeric size with a URL; None when there is none."""
    sized = [(int(k), k, v) for k, v in urls.items()
             if str(k).isdigit() and isinstance(v, str) and v.strip()]
    if not sized:
        return None
    _, key, url = max(sized)
    return key, url


def _allowed_url(url: str) -> bool:
    """https anywhere; plain http only to a loopback host (the dev stack's fake CDN)."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return True
    if parts.scheme != "http" or not parts.hostname:
        return False
    if parts.hostname in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False


def download(http: httpx.Client, url: str, max_bytes: int = MAX_PHOTO_BYTES) -> tuple[bytes, str]:
    """(bytes, Content-Type header) of one photo, streamed; refused past ``max_bytes``.

    From Strava's CDN: no API budget, no usage headers, and never the Authorization header.
    """
    if not _allowed_url(url):
        raise PhotoError("photo URL is neither https nor loopback http")
    try:
        with http.stream("GET", url, headers={"Accept": "image/*,*/*;q=0.5"},
                         timeout=PHOTO_DOWNLOAD_TIMEOUT_S, follow_redirects=True) as response:
            if not _allowed_url(str(response.url)):  # a redirect must not lead anywhere a URL may not
                raise PhotoError("photo redirected to neither https nor loopback http")
            if response.status_code != 200:
                raise PhotoError(f"photo download: HTTP {response.status_code}")
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise PhotoError(f"photo of {declared} bytes is over the {max_bytes}-byte bound")
            body = bytearray()
            for chunk in response.iter_bytes(DOWNLOAD_CHUNK_BYTES):
                body += chunk
                if len(body) > max_bytes:
                    raise PhotoError(f"photo stream passed the {max_bytes}-byte bound")
            return bytes(body), response.headers.get("content-type", "")
    except httpx.HTTPError as exc:
        raise PhotoError(f"photo download: {type(exc).__name__}") from None


def sniff(body: bytes) -> str | None:
    """The content type the leading bytes announce (JPEG, PNG, GIF, WebP, HEIC/AVIF, MP4), or None."""
    for magic, content_type in MAGIC:
        if body.startswith(magic):
            return content_type
    if body[:4] == b"RIFF" and body[8:12] == b"WEBP":
        return "image/webp"
    if body[4:8] == b"ftyp":
        return ISO_BMFF_BRANDS.get(body[8:12])
    return None


def content_type_of(header: str, body: bytes) -> str:
    """The header's type when it names an image or a video, else what the bytes say."""
    declared = header.split(";", 1)[0].strip().lower()
    if declared.startswith(("image/", "video/")):
        return declared
    return sniff(body) or FALLBACK_CONTENT_TYPE


def archive_entries(http: httpx.Client, sink: BlobSink, user_id: str, photos: Sequence[dict[str, Any]],
                    source: str, mirrored: BoundedCache | None = None) -> tuple[list[dict[str, Any]], int]:
    """Mirror each photo; (archive entries, failures). An entry keeps Strava's photo JSON and,
    when the mirror succeeded, ``mirror = {blob_id, content_type, size, url}``.

    ``mirrored`` remembers (user, URL) → (blob id, content type) for a while, so
    the re-run of a job NAKed for its segments (or a quick re-fetch) reuses the
    blob instead of downloading and storing the same photo again.
    """
    entries, failures = [], 0
    for photo in photos:
        entry: dict[str, Any] = {"source": source, "photo": photo}
        chosen = largest_size(photo["urls"] if isinstance(photo.get("urls"), dict) else {})
        try:
            if chosen is None:
                raise PhotoError("photo offers no URL")
            size, url = chosen
            known = mirrored.get((user_id, url)) if mirrored is not None else None
            if known is None:
                body, header = download(http, url)
                content_type = content_type_of(header, body)
                known = (sink.upload(body, content_type, user_id), content_type)
                if mirrored is not None:
                    mirrored.put((user_id, url), known)
            blob_id, content_type = known
            entry["mirror"] = {"blob_id": blob_id, "content_type": content_type, "size": size, "url": url}
        except (PhotoError, ProviderError, RetryableJobError, PermanentJobError) as exc:
            failures += 1
            log.warning("strava photo %s not mirrored: %s", str(photo.get("unique_id") or "?")[:64], exc)
        entries.append(entry)
    return entries, failures


def attachments(entries: Sequence[Any]) -> list[dict[str, Any]]:
    """``Attachment`` dicts (protojson) of the mirrored photos, in archive order.

    Built from the archive entries alone, so ``parse_blob`` yields the same attachments (contract §1).
    """
    out = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("mirror"), dict):
            continue
        mirror = entry["mirror"]
        if not mirror.get("blob_id"):
            continue
        try:
            photo = StravaPhoto.model_validate(entry.get("photo") if isinstance(entry.get("photo"), dict) else {})
        except ValidationError:
            photo = StravaPhoto()
        size = str(mirror.get("size") or "")
        attachment: dict[str, Any] = {"blobId": str(mirror["blob_id"])}
        url = mirror.get("url") or photo.urls.get(size)
        if isinstance(url, str) and url:
            attachment["externalUrl"] = url
        if mirror.get("content_type"):
            attachment["contentType"] = str(mirror["content_type"])
        if photo.caption:
            attachment["caption"] = photo.caption
        dims = photo.sizes.get(size)
        if (isinstance(dims, list) and len(dims) == 2
                and all(isinstance(d, int) and not isinstance(d, bool) and 0 < d < 2**31 for d in dims)):
            attachment["width"], attachment["height"] = dims
        out.append(attachment)
    return out
