"""Where downloaded media waits for a gpu worker: a local directory or S3.

A local directory is enough on one box. When download hosts and GPU hosts
differ, ``VOICY_WORKER_MEDIA_STORE=s3://bucket/prefix`` lets any gpu host read
what any io host stored (boto3; endpoint from ``AWS_ENDPOINT_URL`` or
``VOICY_WORKER_S3_ENDPOINT_URL``). Keys are ``<job id><ext>``, so a key can be
recovered from the ``localSourcePath`` we reported to Voicy.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

from workers.errors import PermanentJobError

S3_PART_BYTES = 8 * 1024 * 1024


class MediaTooLarge(PermanentJobError):
    """The media exceeds the configured size bound."""


class MediaStore(Protocol):
    def put_stream(self, key: str, chunks: Iterable[bytes], max_bytes: int) -> int: ...
    def exists(self, key: str) -> bool: ...
    def local_path(self, key: str) -> contextlib.AbstractContextManager[Path]: ...
    def delete(self, key: str) -> None: ...
    def describe(self, key: str) -> str: ...


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
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if path.parent != self.root:
            raise PermanentJobError("invalid media key")
        return path

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
        yield self._path(key)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def describe(self, key: str) -> str:
        return str(self._path(key))


class S3MediaStore:
    """An S3 bucket and prefix; gpu hosts download to a temporary file for decoding."""

    def __init__(self, bucket: str, prefix: str = "", client: object | None = None) -> None:
        import boto3

        self.bucket, self.prefix = bucket, prefix.strip("/")
        endpoint = os.environ.get("VOICY_WORKER_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
        self._s3 = client or boto3.client("s3", endpoint_url=endpoint)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_stream(self, key: str, chunks: Iterable[bytes], max_bytes: int) -> int:
        with tempfile.SpooledTemporaryFile(max_size=S3_PART_BYTES) as buf:
            for chunk in _bounded(chunks, max_bytes):
                buf.write(chunk)
            size = buf.tell()
            buf.seek(0)
            self._s3.upload_fileobj(buf, self.bucket, self._key(key))  # type: ignore[attr-defined]
        return size

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._s3.head_object(Bucket=self.bucket, Key=self._key(key))  # type: ignore[attr-defined]
            return True
        except ClientError:
            return False

    @contextlib.contextmanager
    def local_path(self, key: str) -> Iterator[Path]:
        suffix = Path(key).suffix
        with tempfile.TemporaryDirectory(prefix="sy-media-") as tmp:
            path = Path(tmp) / f"media{suffix}"
            self._s3.download_file(self.bucket, self._key(key), str(path))  # type: ignore[attr-defined]
            yield path

    def delete(self, key: str) -> None:
        self._s3.delete_object(Bucket=self.bucket, Key=self._key(key))  # type: ignore[attr-defined]

    def describe(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"


def media_store_from_url(url: str) -> MediaStore:
    """``s3://bucket/prefix`` → S3, anything else → a local directory."""
    if url.startswith("s3://"):
        bucket, _, prefix = url[5:].partition("/")
        return S3MediaStore(bucket, prefix)
    return LocalMediaStore(url)
