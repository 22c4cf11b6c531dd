"""Where downloaded media waits for a gpu worker: a local directory or S3."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from workers.errors import PermanentJobError, RetryableJobError

S3_SPOOL_BYTES = 8 * 1024 * 1024  # media below this stays in memory before the upload
S3_CONNECT_TIMEOUT_S = 10.0
S3_READ_TIMEOUT_S = 60.0
S3_MAX_ATTEMPTS = 3  # botocore's own retries
S3_ENDPOINT_ENVS = ("VOICY_WORKER_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL")
DEFAULT_S3_REGION = "us-east-1"
NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})


class MediaTooLarge(PermanentJobError):
    """The media exceeds the configured size bound (``VOICY_WORKER_MAX_MEDIA_BYTES``)."""


class MediaStore(Protocol):
    """What the io and gpu tasks need from a store; keys are plain file names (``<job id><ext>``).

    A key appears whole or not at all (a local rename, a completed S3 upload), and the size
    bound is enforced while streaming, so an oversized download stops instead of filling a disk.
    ``describe(key)`` is what Voicy is told as ``localSourcePath``.
    """

    def put_stream(self, key: str, chunks: Iterable[bytes], max_bytes: int) -> int:
        """Store ``chunks`` under ``key`` atomically; ``MediaTooLarge`` past ``max_bytes``. Returns the size."""
        ...

    def exists(self, key: str) -> bool: ...

    def local_path(self, key: str) -> contextlib.AbstractContextManager[Path]:
        """A local file with the media for the duration of the ``with`` block."""
        ...

    def delete(self, key: str) -> None: ...

    def describe(self, key: str) -> str:
        """The value reported to Voicy as ``localSourcePath``."""
        ...


def _check_key(key: str) -> str:
    if not key or "/" in key or "\\" in key or key in (".", "..") or key.startswith("."):
        raise PermanentJobError("invalid media key")
    return key


def _bounded(chunks: Iterable[bytes], max_bytes: int) -> Iterator[bytes]:
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > max_bytes:
            raise MediaTooLarge(f"media is larger than {max_bytes} bytes")
        yield chunk


class LocalMediaStore:
    """A directory; writes go to a temporary name and are renamed, so readers never see half a file."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def put_stream(self, key: str, chunks: Iterable[bytes], max_bytes: int) -> int:
        final = self._path(key)
        tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.part")
        written = 0
        try:
            with open(tmp, "wb") as fh:
                for chunk in _bounded(chunks, max_bytes):
                    fh.write(chunk)
                    written += len(chunk)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        return written

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    @contextlib.contextmanager
    def local_path(self, key: str) -> Iterator[Path]:
        path = self._path(key)
        if not path.is_file():
            raise RetryableJobError("downloaded media is missing from the media store")
        yield path

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def describe(self, key: str) -> str:
        return str(self._path(key))


def s3_client(endpoint_url: str | None = None) -> Any:
    """A boto3 S3 client suited to S3 and S3-compatible servers (reference/ecosystem.md §3.2).

    Path-style addressing and SigV4 for custom endpoints; CRC checksums only
    when required, because some S3-compatible servers reject the new defaults.
    """
    # Function-level on purpose: boto3 and botocore.config (~200 ms) load only where S3 is configured.
    import boto3
    from botocore.config import Config

    endpoint = endpoint_url or next((os.environ[e] for e in S3_ENDPOINT_ENVS if os.environ.get(e)), None)
    config = Config(signature_version="s3v4", connect_timeout=S3_CONNECT_TIMEOUT_S,
                    read_timeout=S3_READ_TIMEOUT_S, retries={"max_attempts": S3_MAX_ATTEMPTS},
                    s3={"addressing_style": "path"} if endpoint else {},
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_S3_REGION
    return boto3.client("s3", endpoint_url=endpoint, region_name=region, config=config)


class S3MediaStore:
    """An S3 bucket and prefix; gpu hosts download to a temporary file for decoding."""

    def __init__(self, bucket: str, prefix: str = "", client: Any | None = None) -> None:
        if not bucket:
            raise PermanentJobError("media store URL has no bucket")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self._s3 = client or s3_client()

    def _key(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_stream(self, key: str, chunks: Iterable[bytes], max_bytes: int) -> int:
        object_key = self._key(key)
        with tempfile.SpooledTemporaryFile(max_size=S3_SPOOL_BYTES) as buf:
            for chunk in _bounded(chunks, max_bytes):
                buf.write(chunk)
            size = buf.tell()
            buf.seek(0)
            try:
                self._s3.upload_fileobj(buf, self.bucket, object_key)
            except (BotoCoreError, ClientError) as exc:
                raise RetryableJobError(f"media upload to S3 failed: {_describe_error(exc)}") from None
        return size

    def exists(self, key: str) -> bool:
        try:
            self._s3.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as exc:
            if _code(exc) in NOT_FOUND_CODES:
                return False
            raise RetryableJobError(f"S3 head failed: {_describe_error(exc)}") from None
        except BotoCoreError as exc:
            raise RetryableJobError(f"S3 head failed: {_describe_error(exc)}") from None

    @contextlib.contextmanager
    def local_path(self, key: str) -> Iterator[Path]:
        suffix = Path(key).suffix
        with tempfile.TemporaryDirectory(prefix="sy-media-") as tmp:
            path = Path(tmp) / f"media{suffix}"
            try:
                self._s3.download_file(self.bucket, self._key(key), str(path))
            except (BotoCoreError, ClientError) as exc:
                if isinstance(exc, ClientError) and _code(exc) in NOT_FOUND_CODES:
                    raise RetryableJobError("downloaded media is missing from the media store") from None
                raise RetryableJobError(f"media download from S3 failed: {_describe_error(exc)}") from None
            yield path

    def delete(self, key: str) -> None:
        self._s3.delete_object(Bucket=self.bucket, Key=self._key(key))

    def describe(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"


def _code(exc: Any) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def _describe_error(exc: Exception) -> str:
    """Type and S3 error code only: botocore messages may quote request URLs."""
    code = _code(exc)
    return f"{type(exc).__name__} {code}".strip()


def media_store_from_url(url: str) -> MediaStore:
    """``s3://bucket/prefix`` → S3; ``file:///dir`` or a plain path → a local directory.

    S3 lets any gpu host read what any io host stored when they differ (endpoint from
    ``VOICY_WORKER_S3_ENDPOINT_URL`` or ``AWS_ENDPOINT_URL``, credentials from boto3's chain).
    """
    if url.startswith("s3://"):
        bucket, _, prefix = url[len("s3://"):].partition("/")
        return S3MediaStore(bucket, prefix)
    if url.startswith("file://"):
        url = url[len("file://"):]
    return LocalMediaStore(url)
