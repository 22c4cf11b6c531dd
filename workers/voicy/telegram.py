"""Resolve and download a job's Telegram media without ever exposing the bot token.

Follows Voicy's client (reference/voicy.md §6.4): a legacy ``sourceUrl`` only
when it is not token-bearing (§3.4 pattern) and passes the allow-list; else
``filePath``; else ``getFile`` for the ``fileId``. Cloud Bot API paths are
relative and downloaded over HTTP; a local Bot API server (``--local``) returns
absolute paths, copied from disk when the API host is loopback. File URLs
contain ``/file/bot<TOKEN>/``, so errors name the step and status only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from urllib.parse import quote, urlsplit

import httpx

from workers.errors import PermanentJobError, RetryableJobError
from workers.voicy.media_store import MediaStore
from workers.voicy.models import Source
from workers.voicy.settings import VoicySettings

log = logging.getLogger(__name__)

TOKEN_URL_RE = re.compile(r"/(?:file/)?bot\d+:[A-Za-z0-9_-]+(?=/|\?|\Z)", re.ASCII)
CHUNK_BYTES = 64 * 1024
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1"})
MIME_EXTENSIONS = {
    "audio/aac": ".aac", "audio/aiff": ".aiff", "audio/x-aiff": ".aiff", "audio/amr": ".amr",
    "audio/flac": ".flac", "audio/mp4": ".m4a", "audio/x-m4a": ".m4a", "audio/mpeg": ".mp3",
    "audio/ogg": ".ogg", "audio/opus": ".opus", "audio/wav": ".wav", "audio/x-wav": ".wav",
    "audio/webm": ".webm", "video/webm": ".webm", "audio/x-ms-wma": ".wma", "video/3gpp": ".3gp",
    "video/mp4": ".mp4", "video/mpeg": ".mpeg", "video/quicktime": ".mov", "video/x-m4v": ".m4v",
    "video/x-matroska": ".mkv", "video/x-msvideo": ".avi",
}
NO_TOKEN_RESOLVE = "VOICY_WORKER_TELEGRAM_BOT_TOKEN or TOKEN is required to resolve Telegram file ids"
NO_TOKEN_DOWNLOAD = "VOICY_WORKER_TELEGRAM_BOT_TOKEN or TOKEN is required to download Telegram media"


def is_token_bearing(url: str) -> bool:
    return bool(TOKEN_URL_RE.search(url))


def extension_for(source: Source) -> str:
    """The media file extension, by Voicy's precedence (§6.4 step 4)."""
    mime = (source.mime_type or "").lower().split(";")[0].strip()
    if mime in MIME_EXTENSIONS:
        return MIME_EXTENSIONS[mime]
    for name in (source.file_name,):
        if name and PurePosixPath(name).suffix:
            return PurePosixPath(name).suffix.lower()
    if source.source_kind in ("video_note", "video"):
        return ".mp4"
    for candidate in (urlsplit(source.source_url).path if source.source_url else None, source.file_path):
        if candidate and PurePosixPath(candidate).suffix:
            return PurePosixPath(candidate).suffix.lower()
    return ".ogg"


def _is_loopback(url: str) -> bool:
    return (urlsplit(url).hostname or "") in LOOPBACK_HOSTS


def _is_absolute(path: str) -> bool:
    return PurePosixPath(path).is_absolute() or PureWindowsPath(path).is_absolute()


def file_url(api_url: str, token: str, file_path: str) -> str:
    """``{TG}/file/bot{TOKEN}/{path}``, each segment percent-encoded like encodeURIComponent."""
    segments = file_path.lstrip("/").split("/")
    return f"{api_url}/file/bot{token}/" + "/".join(quote(s, safe="!'()*-._~") for s in segments)


def _allowed(url: str, api_url: str) -> bool:
    u, api = urlsplit(url), urlsplit(api_url)
    if (u.scheme, u.netloc) == (api.scheme, api.netloc) and (u.scheme == "https" or _is_loopback(url)):
        return True
    if _is_loopback(url) and _is_loopback(api_url):
        return True
    return u.scheme == "https" and u.hostname == "api.telegram.org"


class TelegramFiles:
    """getFile and download against the cloud or a local Bot API server."""

    def __init__(self, settings: VoicySettings, http: httpx.Client | None = None) -> None:
        self.api_url = settings.telegram_api_url
        self._token = settings.telegram_bot_token.get_secret_value() if settings.telegram_bot_token else None
        self._http = http or httpx.Client(timeout=settings.timeout_s, follow_redirects=False)
        self._max_bytes = settings.max_media_bytes

    def get_file_path(self, file_id: str) -> str:
        if not self._token:
            raise PermanentJobError(NO_TOKEN_RESOLVE)
        try:
            response = self._http.get(f"{self.api_url}/bot{self._token}/getFile", params={"file_id": file_id})
        except httpx.TransportError as exc:
            raise RetryableJobError(f"Telegram getFile failed: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise RetryableJobError(f"Telegram getFile failed: HTTP {response.status_code}")
        path = ((response.json() or {}).get("result") or {}).get("file_path")
        if not path:
            raise RetryableJobError("Telegram getFile response did not include file_path")
        return str(path)

    def chunks(self, url: str) -> Iterator[bytes]:
        """Stream ``url``; errors say only which step failed, never the URL."""
        try:
            with self._http.stream("GET", url) as response:
                if response.status_code != 200:
                    raise RetryableJobError(f"Telegram media download failed: HTTP {response.status_code}")
                yield from response.iter_bytes(CHUNK_BYTES)
        except httpx.TransportError as exc:
            raise RetryableJobError(f"Telegram media download failed: {type(exc).__name__}") from None

    def _from_path(self, file_path: str) -> Iterator[bytes]:
        if _is_loopback(self.api_url) and _is_absolute(file_path):
            return _read_file(Path(file_path))
        if not self._token:
            raise PermanentJobError(NO_TOKEN_DOWNLOAD)
        return self.chunks(file_url(self.api_url, self._token, file_path))

    def open_source(self, source: Source) -> Iterator[bytes]:
        if source.source_url and not is_token_bearing(source.source_url):
            if not _allowed(source.source_url, self.api_url):
                raise PermanentJobError("Worker source URL is not allowed")
            return self.chunks(source.source_url)
        if source.file_path:
            return self._from_path(source.file_path)
        if source.file_id:
            return self._from_path(self.get_file_path(source.file_id))
        raise RetryableJobError("Job source has no URL or Telegram file id")


def _read_file(path: Path) -> Iterator[bytes]:
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK_BYTES):
                yield chunk
    except FileNotFoundError:
        raise RetryableJobError("local Bot API file is missing") from None


_files: TelegramFiles | None = None


def download_to_store(source: Source, store: MediaStore, settings: VoicySettings) -> str:
    """Download the job's media into ``store`` under ``<job id><ext>``; return the key."""
    global _files
    if _files is None:
        _files = TelegramFiles(settings)
    key = f"{source.job_id}{extension_for(source)}"
    size = store.put_stream(key, _files.open_source(source), settings.max_media_bytes)
    log.info("job %s: stored %d bytes of media", source.job_id, size)
    return key
