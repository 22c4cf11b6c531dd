"""The fake Telegram Bot API answers like the real one (getFile, both file URL forms, error shapes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack.fakes.telegram import FakeTelegram

pytestmark = pytest.mark.timeout(30)
BOT_TOKEN = "123456789:AAE-fake-SECRET-token-for-tests"
AUDIO_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "audio"
DATA = b"OggS" + b"\x00" * 60


@pytest.fixture()
def tg() -> Iterator[FakeTelegram]:
    with FakeTelegram(BOT_TOKEN) as fake:
        yield fake


def get_file(tg: FakeTelegram, file_id: str, token: str = BOT_TOKEN, timeout: float = 5) -> httpx.Response:
    return httpx.get(f"{tg.url}/bot{token}/getFile", params={"file_id": file_id}, timeout=timeout)


def test_cloud_get_file_then_download(tg: FakeTelegram) -> None:
    path = tg.add_file("AwAC-1", DATA)
    assert path == "voice/file_1.oga"
    r = get_file(tg, "AwAC-1")
    assert r.status_code == 200
    assert r.json() == {"ok": True, "result": {"file_id": "AwAC-1", "file_unique_id": "AgAD-AwAC-1",
                                               "file_size": len(DATA), "file_path": "voice/file_1.oga"}}
    got = httpx.get(f"{tg.url}/file/bot{BOT_TOKEN}/{r.json()['result']['file_path']}")
    assert got.status_code == 200 and got.content == DATA
    post = httpx.post(f"{tg.url}/bot{BOT_TOKEN}/getFile", json={"file_id": "AwAC-1"})
    assert post.json()["result"]["file_path"] == path
    assert tg.add_file("AwAC-2", DATA, path="music/song.mp3") == "music/song.mp3"


def test_error_shapes(tg: FakeTelegram) -> None:
    tg.add_file("AwAC-1", DATA)
    r = get_file(tg, "AwAC-1", token="123456789:wrong")
    assert (r.status_code, r.json()) == (401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
    r = get_file(tg, "nope")
    assert (r.status_code, r.json()) == (400, {"ok": False, "error_code": 400,
                                               "description": "Bad Request: invalid file_id"})
    assert httpx.get(f"{tg.url}/file/bot123:wrong/voice/file_1.oga").status_code == 401
    assert httpx.get(f"{tg.url}/file/bot{BOT_TOKEN}/voice/missing.oga").status_code == 404


def test_local_mode_returns_an_absolute_path_on_disk() -> None:
    data = (AUDIO_DIR / json.loads((AUDIO_DIR / "manifest.json").read_text())[0]["file"]).read_bytes()
    with FakeTelegram(BOT_TOKEN, local_mode=True) as tg:
        tg.add_file("AwAC-local", data)
        path = get_file(tg, "AwAC-local").json()["result"]["file_path"]
        assert Path(path).is_absolute() and Path(path).read_bytes() == data
        assert httpx.get(f"{tg.url}/file/bot{BOT_TOKEN}{path}").content == data
    assert not Path(path).exists()  # stop() cleans up


def test_fail_next_counts_down_per_stage(tg: FakeTelegram) -> None:
    path = tg.add_file("AwAC-1", DATA)
    tg.fail_next("AwAC-1", status=502, times=2)
    assert [get_file(tg, "AwAC-1").status_code for _ in range(3)] == [502, 502, 200]
    tg.fail_next("AwAC-1", status=404)
    r = get_file(tg, "AwAC-1")
    assert r.json() == {"ok": False, "error_code": 404, "description": "Not Found"}
    tg.fail_next("AwAC-1", status=500, stage="download")
    url = f"{tg.url}/file/bot{BOT_TOKEN}/{path}"
    assert [httpx.get(url).status_code for _ in range(2)] == [500, 200]
    tg.fail_next("AwAC-1", status=429)
    assert get_file(tg, "AwAC-1").json()["parameters"] == {"retry_after": 1}


def test_delay_makes_a_client_time_out(tg: FakeTelegram) -> None:
    path = tg.add_file("slow", DATA)
    tg.delay("slow", 2.0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(f"{tg.url}/file/bot{BOT_TOKEN}/{path}", timeout=0.3)
    tg.delay("slow", 2.0, stage="getFile")
    with pytest.raises(httpx.ReadTimeout):
        get_file(tg, "slow", timeout=0.3)
    tg.clear_faults()
    assert get_file(tg, "slow").status_code == 200


def test_hang_up_closes_a_kept_alive_connection_without_an_answer(tg: FakeTelegram) -> None:
    """What a client sees when the server's keep-alive timer fires as its request arrives."""
    path = tg.add_file("AwAC-1", DATA)
    with httpx.Client(timeout=5) as client:
        get = f"{tg.url}/bot{BOT_TOKEN}/getFile"
        assert client.get(get, params={"file_id": "AwAC-1"}).status_code == 200  # the connection is pooled
        tg.hang_up_next("AwAC-1")
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            client.get(get, params={"file_id": "AwAC-1"})
        tg.hang_up_next("AwAC-1", stage="download", how="reset")
        with pytest.raises(httpx.ReadError):
            client.get(f"{tg.url}/file/bot{BOT_TOKEN}/{path}")
        assert client.get(get, params={"file_id": "AwAC-1"}).status_code == 200  # one-off faults
    assert [(r["kind"], r["status"]) for r in tg.requests] == [("getFile", 200), ("getFile", 0),
                                                               ("download", 0), ("getFile", 200)]


def test_request_log_never_holds_the_token(tg: FakeTelegram) -> None:
    path = tg.add_file("AwAC-1", DATA)
    get_file(tg, "AwAC-1")
    get_file(tg, "AwAC-1", token="999:other-secret")
    httpx.get(f"{tg.url}/file/bot{BOT_TOKEN}/{path}")
    assert [(r["kind"], r["status"]) for r in tg.requests] == [("getFile", 200), ("getFile", 401),
                                                               ("download", 200)]
    text = repr(tg.requests)
    assert BOT_TOKEN not in text and "other-secret" not in text and "AAE" not in text
