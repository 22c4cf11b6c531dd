"""Resolve and download a job's Telegram media without ever exposing the bot token."""

from __future__ import annotations

import logging
import re
import time
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path, PurePosixPath, PureWindowsPath
from urllib.parse import quote, urlsplit

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

from workers.errors import PermanentJobError, RetryableJobError
from workers.voicy.media_store import MediaStore, MediaTooLarge
from workers.voicy.models import Source
from workers.voicy.settings import VoicySettings

log = logging.getLogger(__name__)

TOKEN_URL_RE = re.compile(r"/(?:file/)?bot\d+:[A-Za-z0-9_-]+(?=/|\?|\Z)", re.ASCII)
TOKEN_MARK = "__BOT_TOKEN__"  # stands for the bot token in every URL outside the transport
CHUNK_BYTES = 64 * 1024
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1"})  # Voicy's rule; it never matches [::1]
ENCODE_URI_COMPONENT_SAFE = "!'()*-._~"  # what JavaScript's encodeURIComponent leaves alone
MIME_EXTENSIONS = {
    "audio/aac": ".aac", "audio/aiff": ".aiff", "audio/x-aiff": ".aiff", "audio/amr": ".amr",
    "audio/flac": ".flac", "audio/mp4": ".m4a", "audio/x-m4a": ".m4a", "audio/mpeg": ".mp3",
    "audio/ogg": ".ogg", "audio/opus": ".opus", "audio/wav": ".wav", "audio/x-wav": ".wav",
    "audio/webm": ".webm", "video/webm": ".webm", "audio/x-ms-wma": ".wma", "video/3gpp": ".3gp",
    "video/mp4": ".mp4", "video/mpeg": ".mpeg", "video/quicktime": ".mov", "video/x-m4v": ".m4v",
    "video/x-matroska": ".mkv", "video/x-msvideo": ".avi",
}
DEFAULT_EXTENSION = ".ogg"
NO_TOKEN_RESOLVE = "VOICY_WORKER_TELEGRAM_BOT_TOKEN or TOKEN is required to resolve Telegram file ids"
NO_TOKEN_DOWNLOAD = "VOICY_WORKER_TELEGRAM_BOT_TOKEN or TOKEN is required to download Telegram media"
NOT_ALLOWED = "Worker source URL is not allowed"
FILE_TOO_BIG = "file is too big"  # Telegram's description for media over the cloud cap
# How a connection the server closed unanswered fails: a FIN (RemoteProtocolError), or an RST on read
# or write. Timeouts and refused connections are not among them: those are the job's retry's business.
SERVER_CLOSED_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
SERVER_CLOSED_TRIES = 2  # the request, and once more on a new connection


def is_token_bearing(url: str) -> bool:
    """Voicy's exact test (§3.4): ``/bot<digits>:<token>`` followed by ``/``, ``?`` or the end."""
    return bool(TOKEN_URL_RE.search(url))


def extension_for(source: Source) -> str:
    """The media file extension, by Voicy's precedence (§6.4 step 4)."""
    mime = (source.mime_type or "").lower().split(";")[0].strip()
    if mime in MIME_EXTENSIONS:
        return MIME_EXTENSIONS[mime]
    if source.file_name and PurePosixPath(source.file_name).suffix:
        return PurePosixPath(source.file_name).suffix.lower()
    if source.source_kind in ("video_note", "video"):
        return ".mp4"
    if source.source_url:
        return PurePosixPath(urlsplit(source.source_url).path).suffix.lower() or DEFAULT_EXTENSION
    if source.file_path:
        return _suffix(source.file_path) or DEFAULT_EXTENSION
    return DEFAULT_EXTENSION


def _suffix(path: str) -> str:
    pure = PureWindowsPath(path) if "\\" in path else PurePosixPath(path)
    return pure.suffix.lower()


def _is_loopback(url: str) -> bool:
    return (urlsplit(url).hostname or "") in LOOPBACK_HOSTS


def _is_absolute(path: str) -> bool:
    return PurePosixPath(path).is_absolute() or PureWindowsPath(path).is_absolute()


def file_url(api_url: str, token: str, file_path: str) -> str:
    """``{TG}/file/bot{TOKEN}/{path}``: leading ``/`` stripped, each segment encodeURIComponent-ed."""
    segments = file_path.lstrip("/").split("/")
    return f"{api_url}/file/bot{token}/" + "/".join(quote(s, safe=ENCODE_URI_COMPONENT_SAFE)
                                                    for s in segments)


def _allowed(url: str, api_url: str) -> bool:
    """Voicy's allow-list for a legacy ``sourceUrl`` (§6.4 step 5)."""
    u, api = urlsplit(url), urlsplit(api_url)
    if (u.scheme, u.netloc) == (api.scheme, api.netloc) and (u.scheme == "https" or _is_loopback(url)):
        return True
    if _is_loopback(url) and _is_loopback(api_url):
        return True
    return u.scheme == "https" and u.hostname == "api.telegram.org"


class BotTokenTransport(httpx.BaseTransport):
    """Replaces ``/bot__BOT_TOKEN__/`` with the real token on the wire, for the Bot API origin only.

    Every URL we build carries ``TOKEN_MARK`` instead of the token, so httpx's request log, its
    exceptions and our messages only ever see ``/bot__BOT_TOKEN__/``.
    """

    def __init__(self, api_url: str, token: str | None, inner: httpx.BaseTransport | None = None) -> None:
        api = httpx.URL(api_url)
        self._origin = (api.scheme, api.host, api.port)
        self._mark = f"/bot{TOKEN_MARK}/".encode()
        self._real = f"/bot{token}/".encode() if token else None
        self._inner = inner or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if self._real and self._mark in url.raw_path and (url.scheme, url.host, url.port) == self._origin:
            wire = httpx.Request(request.method, url.copy_with(raw_path=url.raw_path.replace(
                self._mark, self._real, 1)), headers=request.headers, stream=request.stream,
                extensions=request.extensions)
            return self._inner.handle_request(wire)
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


class TelegramFiles:
    """getFile and download against the cloud or a local Bot API server.

    Errors (§6.8): a missing bot token and a refused source URL are permanent; getFile or
    download HTTP errors, timeouts and file-system errors are retryable, except Telegram's
    "file is too big" and our size bound, which no retry can fix.
    """

    def __init__(self, settings: VoicySettings, transport: httpx.BaseTransport | None = None) -> None:
        self.api_url = settings.telegram_api_url
        self._has_token = settings.telegram_bot_token is not None
        token = settings.telegram_bot_token.get_secret_value() if settings.telegram_bot_token else None
        inner = transport or httpx.HTTPTransport(proxy=_env_proxy(self.api_url))
        # trust_env=False: httpx would otherwise mount env proxies *beside* our transport.
        self._http = httpx.Client(timeout=settings.timeout_s, follow_redirects=False, trust_env=False,
                                  transport=BotTokenTransport(self.api_url, token, inner))
        self._timeout_s = settings.timeout_s
        self.max_bytes = settings.max_media_bytes  # None only for settings built without ``_derive``

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TelegramFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get_file_path(self, file_id: str) -> str:
        """``getFile`` → ``result.file_path`` (``ok`` is not checked, like Voicy's client)."""
        if not self._has_token:
            raise PermanentJobError(NO_TOKEN_RESOLVE)
        try:
            response = self._get("getFile", f"{self.api_url}/bot{TOKEN_MARK}/getFile",
                                 params={"file_id": file_id})
        except httpx.TransportError as exc:
            raise RetryableJobError(f"Telegram getFile failed: {type(exc).__name__}") from None
        payload = _json(response)
        if response.status_code != 200:
            description = str(payload.get("description") or "")
            if response.status_code == 400 and FILE_TOO_BIG in description.lower():
                raise PermanentJobError("Telegram getFile failed: file is too big for the Bot API")
            hint = " (check VOICY_WORKER_TELEGRAM_BOT_TOKEN)" if response.status_code == 401 else ""
            raise RetryableJobError(f"Telegram getFile failed: HTTP {response.status_code}{hint}")
        result = payload.get("result")
        path = result.get("file_path") if isinstance(result, dict) else None
        if not path:
            raise RetryableJobError("Telegram getFile response did not include file_path")
        return str(path)

    def chunks(self, url: str) -> Iterator[bytes]:
        """Stream ``url`` within the download timeout and the size bound; errors never hold the URL."""
        deadline = time.monotonic() + self._timeout_s
        try:
            with closing(self._get("media download", url, stream=True)) as response:
                if response.status_code != 200:
                    raise RetryableJobError(f"Telegram media download failed: HTTP {response.status_code}")
                declared = response.headers.get("content-length", "")
                if self.max_bytes is not None and declared.isdigit() and int(declared) > self.max_bytes:
                    raise MediaTooLarge(f"media is larger than {self.max_bytes} bytes")
                for chunk in response.iter_bytes(CHUNK_BYTES):
                    if time.monotonic() > deadline:
                        raise RetryableJobError("Telegram media download failed: Timeout "
                                                f"(over {self._timeout_s:g}s)")
                    yield chunk
        except httpx.TransportError as exc:
            raise RetryableJobError(f"Telegram media download failed: {type(exc).__name__}") from None

    def _get(self, what: str, url: str, *, params: dict[str, str] | None = None,
             stream: bool = False) -> httpx.Response:
        """GET ``url``, once more if the server closed the connection unanswered.

        Any HTTP/1.1 server may close an idle keep-alive connection at any moment (RFC 9112
        §9.3.1), racing our pooled client's send; both requests are idempotent GETs (RFC 9110
        §9.2.2).

        ``stream=True`` returns before the body is read (the caller closes the response), so
        a download is never sent again after any of its bytes were read.
        """
        retrying = Retrying(stop=stop_after_attempt(SERVER_CLOSED_TRIES), reraise=True,
                            retry=retry_if_exception_type(SERVER_CLOSED_ERRORS),
                            before_sleep=lambda state: log.info(
                                "Telegram %s: the server closed the connection unanswered (%s); sending it "
                                "again", what, type(state.outcome and state.outcome.exception()).__name__))
        return retrying(lambda: self._http.send(self._http.build_request("GET", url, params=params),
                                                stream=stream))

    def _from_path(self, file_path: str) -> Iterator[bytes]:
        if _is_loopback(self.api_url) and _is_absolute(file_path):
            return _read_file(Path(file_path))
        if not self._has_token:
            raise PermanentJobError(NO_TOKEN_DOWNLOAD)
        return self.chunks(file_url(self.api_url, TOKEN_MARK, file_path))

    def open_source(self, source: Source) -> Iterator[bytes]:
        """The media's bytes, lazily; resolution errors are raised now, transfer errors while iterating.

        As Voicy's client (reference/voicy.md §6.4): a legacy ``sourceUrl`` only when not
        token-bearing and allowed; else ``filePath``; else ``getFile``. A local Bot API server's
        absolute paths are read from disk when its host is loopback.
        """
        if source.source_url and not is_token_bearing(source.source_url):
            if not _allowed(source.source_url, self.api_url):
                raise PermanentJobError(NOT_ALLOWED)
            return self.chunks(source.source_url)
        if source.file_path:
            return self._from_path(source.file_path)
        if source.file_id:
            return self._from_path(self.get_file_path(source.file_id))
        raise RetryableJobError("Job source has no URL or Telegram file id")


def _env_proxy(url: str) -> str | None:
    """The ``HTTPS_PROXY``/``HTTP_PROXY`` for ``url`` unless ``NO_PROXY`` exempts its host."""
    parts = urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)


def _json(response: httpx.Response) -> dict:
    try:
        payload = response.json()
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}


def _read_file(path: Path) -> Iterator[bytes]:
    """A local Bot API server's file, copied from disk; fs errors are retryable (§6.8)."""
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK_BYTES):
                yield chunk
    except OSError as exc:
        raise RetryableJobError(f"local Bot API file could not be read: {type(exc).__name__}") from None


def download_to_store(source: Source, store: MediaStore, files: TelegramFiles) -> str:
    """Download the job's media through ``files`` into ``store`` under ``<job id><ext>``; return the key."""
    key = f"{source.job_id}{extension_for(source)}"
    assert files.max_bytes is not None  # VoicySettings._derive defaults it to the Bot API's cap
    size = store.put_stream(key, files.open_source(source), files.max_bytes)
    log.info("job %s: stored %d bytes of media as %s", source.job_id, size, key)
    return key
