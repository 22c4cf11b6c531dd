"""Telegram media resolution and download against the fake Bot API on loopback (reference/voicy.md §6.4)."""

from __future__ import annotations

import gc
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devstack.fakes.telegram import FakeTelegram, HangUp, Stage
from workers.errors import PermanentJobError, RetryableJobError
from workers.voicy.media_store import LocalMediaStore, MediaTooLarge
from workers.voicy.models import Source
from workers.voicy.runtime import VoicyRuntime
from workers.voicy.settings import VoicySettings
from workers.voicy.telegram import (
    NO_TOKEN_DOWNLOAD,
    NO_TOKEN_RESOLVE,
    NOT_ALLOWED,
    TOKEN_MARK,
    TelegramFiles,
    download_to_store,
    extension_for,
    file_url,
    is_token_bearing,
)

BOT_TOKEN = "987654321:AAH-telegram-SECRET_token-0123456789ab"
BOT_SECRET_HALF = BOT_TOKEN.split(":", 1)[1]
DATA = b"OggS" + bytes(range(256)) * 40  # ~10 KiB, several chunks of nothing in particular
OpenFiles = Callable[[VoicySettings], TelegramFiles]


@pytest.fixture()
def open_files() -> Iterator[OpenFiles]:
    """``TelegramFiles`` for one test, each closed at its end (its pooled connections with it)."""
    opened: list[TelegramFiles] = []

    def open_one(settings: VoicySettings) -> TelegramFiles:
        opened.append(TelegramFiles(settings))
        return opened[-1]

    yield open_one
    for files in opened:
        files.close()


@pytest.fixture(scope="module")
def cloud() -> Iterator[FakeTelegram]:
    with FakeTelegram(BOT_TOKEN) as tg:
        yield tg


@pytest.fixture(scope="module")
def local_api() -> Iterator[FakeTelegram]:
    with FakeTelegram(BOT_TOKEN, local_mode=True) as tg:
        yield tg


def settings_for(tg_url: str, tmp: Path, bot_token: str | None = BOT_TOKEN, timeout_ms: float = 5000,
                 max_bytes: int | None = None) -> VoicySettings:
    return VoicySettings(api_url="http://127.0.0.1:9/worker/v1", token="voicy-token-unused",
                         work_dir=tmp, telegram_api_url=tg_url, telegram_bot_token=bot_token,
                         download_timeout_ms=timeout_ms, max_media_bytes=max_bytes)


def _everything(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc)


def _assert_token_free(text: str) -> None:
    assert BOT_TOKEN not in text and BOT_SECRET_HALF not in text


def test_cloud_file_id_is_resolved_and_streamed_into_the_store(cloud: FakeTelegram, tmp_path: Path,
                                                               open_files: OpenFiles,
                                                               http_logs: pytest.LogCaptureFixture) -> None:
    cloud.add_file("AwAC-cloud", DATA, path="voice/file 7 ü.oga")  # needs segment encoding
    store = LocalMediaStore(tmp_path / "media")
    files = open_files(settings_for(cloud.url, tmp_path))
    key = download_to_store(Source(job_id="665f00000000000000000001", file_id="AwAC-cloud",
                                   mime_type="audio/ogg"), store, files)
    assert key == "665f00000000000000000001.ogg"
    with store.local_path(key) as path:
        assert path.read_bytes() == DATA
    assert [r["status"] for r in cloud.requests_of("download")][-1] == 200
    assert "getFile" in http_logs.text and f"bot{TOKEN_MARK}" in http_logs.text  # httpx logged the placeholder
    _assert_token_free(http_logs.text)


def test_known_file_path_skips_get_file(cloud: FakeTelegram, tmp_path: Path, open_files: OpenFiles) -> None:
    path = cloud.add_file("AwAC-known", DATA)
    get_files = len(cloud.requests_of("getFile"))
    files = open_files(settings_for(cloud.url, tmp_path))
    assert b"".join(files.open_source(Source(job_id="j", file_id="AwAC-known", file_path=path))) == DATA
    assert len(cloud.requests_of("getFile")) == get_files


def test_local_bot_api_absolute_path_is_copied_from_disk(local_api: FakeTelegram, tmp_path: Path,
                                                         open_files: OpenFiles) -> None:
    disk_path = local_api.add_file("AwAC-local", DATA)
    assert Path(disk_path).is_absolute()
    downloads = len(local_api.requests_of("download"))
    files = open_files(settings_for(local_api.url, tmp_path))
    assert b"".join(files.open_source(Source(job_id="j", file_id="AwAC-local"))) == DATA
    assert len(local_api.requests_of("download")) == downloads  # copied, not fetched over HTTP
    Path(disk_path).unlink()
    with pytest.raises(RetryableJobError, match="could not be read"):
        b"".join(files.open_source(Source(job_id="j", file_path=disk_path)))


def test_source_url_rules(cloud: FakeTelegram, tmp_path: Path, open_files: OpenFiles) -> None:
    cloud.add_file("AwAC-url", DATA, path="voice/legacy.oga")
    files = open_files(settings_for(cloud.url, tmp_path))
    token_url = f"https://api.telegram.org/file/bot{BOT_TOKEN}/voice/legacy.oga"
    # A token-bearing legacy URL is never used: the file id is resolved instead.
    got = b"".join(files.open_source(Source(job_id="j", file_id="AwAC-url", source_url=token_url)))
    assert got == DATA
    with pytest.raises(PermanentJobError, match=NOT_ALLOWED):
        files.open_source(Source(job_id="j", source_url="https://example.invalid/x.ogg"))
    with pytest.raises(RetryableJobError, match="no URL or Telegram file id"):
        files.open_source(Source(job_id="j"))


def test_missing_bot_token_is_permanent_with_voicys_messages(tmp_path: Path, open_files: OpenFiles) -> None:
    files = open_files(settings_for("https://api.telegram.org", tmp_path, bot_token=None))
    with pytest.raises(PermanentJobError) as resolve:
        files.open_source(Source(job_id="j", file_id="x"))
    assert str(resolve.value) == NO_TOKEN_RESOLVE
    with pytest.raises(PermanentJobError) as download:
        files.open_source(Source(job_id="j", file_path="voice/x.oga"))
    assert str(download.value) == NO_TOKEN_DOWNLOAD


@pytest.mark.parametrize(("stage", "status"), [("getFile", 404), ("getFile", 502), ("download", 500),
                                               ("download", 404)])
def test_http_errors_are_retryable_and_token_free(cloud: FakeTelegram, tmp_path: Path, stage: Stage,
                                                  status: int, http_logs: pytest.LogCaptureFixture,
                                                  open_files: OpenFiles) -> None:
    file_id = f"AwAC-{stage}-{status}"
    cloud.add_file(file_id, DATA)
    cloud.fail_next(file_id, status=status, stage=stage)
    files = open_files(settings_for(cloud.url, tmp_path))
    with pytest.raises(RetryableJobError, match=f"HTTP {status}") as info:
        b"".join(files.open_source(Source(job_id="j", file_id=file_id)))
    _assert_token_free(_everything(info.value))
    _assert_token_free(http_logs.text)
    assert b"".join(files.open_source(Source(job_id="j", file_id=file_id))) == DATA  # the fault was one-off


@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize("stage", ["getFile", "download"])
def test_a_connection_the_server_closes_unanswered_is_retried_once(cloud: FakeTelegram, tmp_path: Path,
                                                                  stage: Stage, how: HangUp,
                                                                  http_logs: pytest.LogCaptureFixture,
                                                                  open_files: OpenFiles) -> None:
    """A keep-alive server may close an idle connection just as a request goes out on it (RFC 9112
    §9.3.1; seen in the chaos run as ``Telegram getFile failed: RemoteProtocolError``): both requests are
    idempotent GETs, so the client sends it once more, on a new connection, and the job never notices."""
    file_id = f"AwAC-hangup-{stage}-{how}"
    cloud.add_file(file_id, DATA)
    files = open_files(settings_for(cloud.url, tmp_path))
    assert b"".join(files.open_source(Source(job_id="j", file_id=file_id))) == DATA  # connection pooled
    cloud.hang_up_next(file_id, stage=stage, how=how)
    before = len(cloud.requests_of(stage))
    assert b"".join(files.open_source(Source(job_id="j", file_id=file_id))) == DATA
    assert [r["status"] for r in cloud.requests_of(stage)[before:]] == [0, 200]
    assert "closed the connection unanswered" in http_logs.text  # said at INFO, not a job failure
    _assert_token_free(http_logs.text)


@pytest.mark.parametrize("stage", ["getFile", "download"])
def test_a_second_hang_up_is_a_retryable_failure_not_a_loop(cloud: FakeTelegram, tmp_path: Path, stage: Stage,
                                                            http_logs: pytest.LogCaptureFixture,
                                                            open_files: OpenFiles) -> None:
    file_id = f"AwAC-hangup-twice-{stage}"
    cloud.add_file(file_id, DATA)
    cloud.hang_up_next(file_id, stage=stage, times=3)
    before = len(cloud.requests_of(stage))
    files = open_files(settings_for(cloud.url, tmp_path))
    try:
        with pytest.raises(RetryableJobError, match="RemoteProtocolError") as info:
            b"".join(files.open_source(Source(job_id="j", file_id=file_id)))
    finally:
        cloud.clear_faults()
    assert len(cloud.requests_of(stage)) - before == 2
    _assert_token_free(_everything(info.value))
    _assert_token_free(http_logs.text)


def test_wrong_token_and_unknown_file_are_retryable(cloud: FakeTelegram, tmp_path: Path, open_files: OpenFiles) -> None:
    wrong = open_files(settings_for(cloud.url, tmp_path, bot_token="111:wrong-token-value-xyz"))
    with pytest.raises(RetryableJobError, match="HTTP 401.*VOICY_WORKER_TELEGRAM_BOT_TOKEN") as info:
        wrong.open_source(Source(job_id="j", file_id="whatever"))
    assert "wrong-token-value" not in _everything(info.value)
    with pytest.raises(RetryableJobError, match="HTTP 400"):
        open_files(settings_for(cloud.url, tmp_path)).open_source(Source(job_id="j", file_id="nope"))


def test_download_timeout_is_retryable(cloud: FakeTelegram, tmp_path: Path, open_files: OpenFiles) -> None:
    cloud.add_file("AwAC-slow", DATA)
    cloud.delay("AwAC-slow", 3.0)
    files = open_files(settings_for(cloud.url, tmp_path, timeout_ms=300))
    try:
        with pytest.raises(RetryableJobError, match="Timeout") as info:
            b"".join(files.open_source(Source(job_id="j", file_id="AwAC-slow")))
    finally:
        cloud.clear_faults()
    _assert_token_free(_everything(info.value))


def test_size_bound_is_permanent_and_leaves_nothing(cloud: FakeTelegram, tmp_path: Path,
                                                    open_files: OpenFiles) -> None:
    cloud.add_file("AwAC-big", DATA)
    store = LocalMediaStore(tmp_path / "media")
    files = open_files(settings_for(cloud.url, tmp_path, max_bytes=1024))
    with pytest.raises(MediaTooLarge) as info:
        download_to_store(Source(job_id="jbig", file_id="AwAC-big"), store, files)
    assert not info.value.retryable
    assert list((tmp_path / "media").iterdir()) == []


def test_closing_the_runtime_closes_its_telegram_connections(cloud: FakeTelegram, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A process's runtime owns its one Bot API client: downloads reuse its pooled connection, and
    ``close`` closes it, so a runtime dropped after fork or at exit leaves no socket open."""
    cloud.add_file("AwAC-runtime", DATA)
    for key, value in {"VOICY_WORKER_API_URL": "http://127.0.0.1:9/worker/v1", "VOICY_WORKER_TOKEN": "unused",
                       "VOICY_WORKER_WORK_DIR": str(tmp_path), "VOICY_WORKER_TELEGRAM_API_URL": cloud.url,
                       "VOICY_WORKER_TELEGRAM_BOT_TOKEN": BOT_TOKEN}.items():
        monkeypatch.setenv(key, value)
    rt = VoicyRuntime.from_env("redis://127.0.0.1:9/0")  # never connects: nothing here talks to Redis
    assert "telegram" not in vars(rt)  # made at the first download: a bridge or gpu worker never pays for it
    for job_id in ("jrt1", "jrt2"):
        download_to_store(Source(job_id=job_id, file_id="AwAC-runtime"), rt.store, rt.telegram)
    assert [r["status"] for r in cloud.requests_of("download")][-2:] == [200, 200]
    rt.close()
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)  # an unclosed socket's warning, raised in __del__
        del rt
        gc.collect()
    assert unraisable == []


def test_url_and_extension_rules() -> None:
    assert is_token_bearing(f"https://api.telegram.org/file/bot{BOT_TOKEN}/voice/x.oga")
    assert is_token_bearing(f"http://127.0.0.1:8081/bot{BOT_TOKEN}?x=1")  # host is not checked
    assert not is_token_bearing(f"https://h/bot{BOT_TOKEN}#frag")  # '#' right after: no match (§3.4)
    assert not is_token_bearing("https://example.invalid/proof.ogg")
    assert file_url("http://h", "1:t", "/voice/a b/ü(1).oga") == "http://h/file/bot1:t/voice/a%20b/%C3%BC(1).oga"
    cases = [
        (dict(mimeType="Audio/MPEG; x=1", fileName="a.wav"), ".mp3"),
        (dict(mimeType="application/octet-stream", fileName="Talk.M4A"), ".m4a"),
        (dict(sourceKind="video_note", filePath="v/x.oga"), ".mp4"),
        (dict(sourceUrl="https://h/a/b.opus?x=1", filePath="v/x.oga"), ".opus"),
        (dict(sourceUrl="https://h/a/noext", filePath="v/x.oga"), ".ogg"),
        (dict(filePath="voice/file_1.oga"), ".oga"),
        (dict(filePath="C:\\bot\\voice\\file_1.WAV"), ".wav"),
        (dict(), ".ogg"),
    ]
    for fields, ext in cases:
        assert extension_for(Source(jobId="j", **fields)) == ext, fields
