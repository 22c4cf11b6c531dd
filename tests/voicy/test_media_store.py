"""Media stores: a local directory and S3 on a real moto server (loopback), never moto's in-process mock."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, SimpleNamespace

import pytest

from workers.errors import PermanentJobError, RetryableJobError
from workers.voicy.media_store import LocalMediaStore, MediaTooLarge, S3MediaStore, media_store_from_url, s3_client
from workers.voicy.transcription import _Batch

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture()
def s3_env(monkeypatch: pytest.MonkeyPatch, s3_endpoint: str) -> str:
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("VOICY_WORKER_S3_ENDPOINT_URL", s3_endpoint)
    return s3_endpoint


@pytest.fixture()
def bucket(s3_env: str, request: pytest.FixtureRequest) -> Iterator[str]:
    name = "media-" + request.node.name.replace("_", "-")[:40].lower()
    client = s3_client()
    client.create_bucket(Bucket=name)
    yield name
    for obj in client.list_objects_v2(Bucket=name).get("Contents", []):
        client.delete_object(Bucket=name, Key=obj["Key"])
    client.delete_bucket(Bucket=name)


def test_local_store_round_trip(tmp_path: Path) -> None:
    store = LocalMediaStore(tmp_path / "m")
    assert store.put_stream("j1.ogg", iter([b"12", b"34"]), max_bytes=4) == 4  # exactly the bound is fine
    assert store.exists("j1.ogg") and not store.exists("j2.ogg")
    assert store.describe("j1.ogg") == str((tmp_path / "m" / "j1.ogg").resolve())
    with store.local_path("j1.ogg") as path:
        assert path.read_bytes() == b"1234"
    store.put_stream("j1.ogg", [b"new"], max_bytes=10)  # a re-download replaces the old file
    with store.local_path("j1.ogg") as path:
        assert path.read_bytes() == b"new"
    store.delete("j1.ogg")
    store.delete("j1.ogg")  # idempotent
    assert not store.exists("j1.ogg")
    with pytest.raises(RetryableJobError, match="missing"):
        with store.local_path("j1.ogg"):
            pass


def test_local_write_is_atomic_and_bounded(tmp_path: Path) -> None:
    store = LocalMediaStore(tmp_path)
    seen_mid_write: list[bool] = []

    def chunks() -> Iterator[bytes]:
        yield b"x" * 8
        seen_mid_write.append(store.exists("a.ogg"))  # a reader must not see half a file
        yield b"y" * 8

    store.put_stream("a.ogg", chunks(), max_bytes=100)
    assert seen_mid_write == [False] and store.exists("a.ogg")
    with pytest.raises(MediaTooLarge) as info:
        store.put_stream("b.ogg", [b"x" * 8, b"y" * 8], max_bytes=10)
    assert not info.value.retryable
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ogg"]  # no partial, no temp file

    def failing() -> Iterator[bytes]:
        yield b"x"
        raise RetryableJobError("network went away")

    with pytest.raises(RetryableJobError):
        store.put_stream("c.ogg", failing(), max_bytes=100)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.ogg"]


@pytest.mark.parametrize("key", ["../escape.ogg", "a/b.ogg", ".hidden", "", "..", "c:\\x.ogg"])
def test_keys_cannot_escape_the_store(tmp_path: Path, key: str) -> None:
    with pytest.raises(PermanentJobError, match="invalid media key"):
        LocalMediaStore(tmp_path).put_stream(key, [b"x"], max_bytes=10)


def test_s3_store_round_trip_against_moto_server(bucket: str) -> None:
    store = media_store_from_url(f"s3://{bucket}/jobs/")
    assert isinstance(store, S3MediaStore)
    payload = b"OggS" + b"\x00" * 5000
    assert store.put_stream("j1.ogg", iter([payload[:100], payload[100:]]), max_bytes=len(payload)) == 5004
    assert store.exists("j1.ogg") and not store.exists("other.ogg")
    assert store.describe("j1.ogg") == f"s3://{bucket}/jobs/j1.ogg"
    raw = s3_client().get_object(Bucket=bucket, Key="jobs/j1.ogg")["Body"].read()
    assert raw == payload
    with store.local_path("j1.ogg") as path:
        assert path.read_bytes() == payload and path.suffix == ".ogg"
        kept = path
    assert not kept.exists()  # the temporary copy is gone after the block
    store.delete("j1.ogg")
    assert not store.exists("j1.ogg")
    with pytest.raises(RetryableJobError, match="missing"):
        with store.local_path("j1.ogg"):
            pass


def test_s3_size_bound_uploads_nothing(bucket: str) -> None:
    store = S3MediaStore(bucket, "", client=s3_client())
    with pytest.raises(MediaTooLarge):
        store.put_stream("big.ogg", [b"x" * 600, b"y" * 600], max_bytes=1000)
    assert not store.exists("big.ogg")
    assert s3_client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


def test_s3_unreachable_or_missing_bucket_is_retryable(s3_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RetryableJobError):
        S3MediaStore("no-such-bucket-here", "p").put_stream("x.ogg", [b"abc"], max_bytes=10)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("VOICY_WORKER_S3_ENDPOINT_URL", dead)
    with pytest.raises(RetryableJobError, match="EndpointConnectionError"):
        media_store_from_url("s3://any-bucket").exists("x.ogg")


def test_media_store_from_url_local_forms(tmp_path: Path) -> None:
    for url in (str(tmp_path / "plain"), f"file://{tmp_path / 'file-url'}"):
        store = media_store_from_url(url)
        assert isinstance(store, LocalMediaStore)
        store.put_stream("k.ogg", [b"1"], max_bytes=1)
        assert Path(store.describe("k.ogg")).is_file()


def test_a_shutdown_during_a_batchs_start_leaves_no_s3_copy(bucket: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """SystemExit (a worker's cold shutdown) reaches the batch while its start threads fetch media:
    the copies they made are removed then, not left to the exiting child. The jobs are stand-ins
    whose ``start`` is the ``/transcribe`` round trip; the store, its copies and the threads are real."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where S3MediaStore.local_path copies to
    store = S3MediaStore(bucket)
    for key in ("a.ogg", "b.ogg"):
        store.put_stream(key, [b"OggS"], max_bytes=16)
    first_copied, released = threading.Event(), threading.Event()

    class Watched:  # the real store; says when the first job's copy exists
        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

        @contextlib.contextmanager
        def local_path(self, key: str) -> Iterator[Path]:
            with store.local_path(key) as path:
                first_copied.set()
                yield path

    def start(key: str) -> SimpleNamespace:
        if key == "b.ogg":  # the shutdown lands while this job's /transcribe is on the wire
            assert first_copied.wait(10)
            os.kill(os.getpid(), signal.SIGUSR1)
            assert released.wait(10)
        return SimpleNamespace(media_key=key, language="en")

    def shut_down(signum: int, frame: FrameType | None) -> None:
        released.set()
        raise SystemExit(0)

    jobs = [SimpleNamespace(start=lambda key=key: start(key)) for key in ("a.ogg", "b.ogg")]
    previous = signal.signal(signal.SIGUSR1, shut_down)
    try:
        with pytest.raises(SystemExit) as info:  # its traceback keeps _open_all's frame, and any copy, alive
            _Batch(SimpleNamespace(store=Watched()))._open_all(jobs)  # type: ignore[arg-type]
        assert released.is_set()
        assert list(tmp_path.glob("sy-media-*")) == [], "a start thread's S3 copy outlived the shutdown"
        del info
    finally:
        signal.signal(signal.SIGUSR1, previous)
