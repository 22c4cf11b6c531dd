"""NatsThread from sync code, connection options, publish routing and presence/manifest on a real nats-server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import nats
import pytest

from devstack.infra import services
from tests.kit.cairn_ctx import core_bucket
from workers.cairn import presence
from workers.cairn.contract import subjects
from workers.cairn.nats_conn import NatsThread, connect_options
from workers.cairn.routing import PublishRouter
from workers.cairn.settings import CairnSettings
from workers.providers.registry import get_provider

POOL = "strava-fetcher"


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    with services.nats_server() as svc:
        yield svc.url


@pytest.fixture()
def thread(nats_url: str) -> Iterator[NatsThread]:
    t = NatsThread(CairnSettings(nats_url=nats_url, worker_name=POOL))
    yield t
    t.close()


def test_run_from_sync_code_and_request_reply(thread: NatsThread) -> None:
    nc = thread.nc  # connects lazily, from this (non-loop) thread
    assert nc.is_connected and thread.js is not None
    assert thread.nc is nc  # one connection per process, reused

    async def echo(msg: Any) -> None:
        await msg.respond(msg.data.upper())

    async def roundtrip() -> bytes:
        await nc.subscribe("test.echo", cb=echo)
        return (await nc.request("test.echo", b"ping", timeout=2)).data

    assert thread.run(roundtrip(), 5) == b"PING"
    # several sync callers at once share the loop safely
    out: list[bytes] = []

    def call(i: int) -> None:
        out.append(thread.run(nc.request("test.echo", f"c{i}".encode(), timeout=2), 5).data)

    callers = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for c in callers:
        c.start()
    for c in callers:
        c.join(10)
    assert sorted(out) == sorted(f"C{i}".encode() for i in range(8))


def test_run_propagates_exceptions_and_refuses_after_close(nats_url: str) -> None:
    t = NatsThread(CairnSettings(nats_url=nats_url, worker_name=POOL))
    nc = t.nc
    with pytest.raises(nats.errors.NoRespondersError):
        t.run(nc.request("nobody.listens", b"", timeout=1), 5)
    t.close()
    t.close()  # idempotent
    assert nc.is_closed
    with pytest.raises(RuntimeError):
        t.run(nc.flush(), 1)


def test_connection_name_is_the_worker_name(thread: NatsThread) -> None:
    assert thread.nc.options["name"] == POOL
    assert thread.nc.options["max_reconnect_attempts"] == -1


def test_connect_options_per_auth_mode(tmp_path: Any) -> None:
    url = "nats://127.0.0.1:4222"
    token = connect_options(CairnSettings(nats_url=url, worker_name=POOL, worker_enrollment_token="tok"))
    again = connect_options(CairnSettings(nats_url=url, worker_name=POOL, worker_enrollment_token="tok"))
    assert token["token"] == "tok" and token["name"] == POOL and token["max_reconnect_attempts"] == -1
    assert token["nkeys_seed_str"].startswith("SU") and token["nkeys_seed_str"] != again["nkeys_seed_str"]
    userpass = connect_options(CairnSettings(nats_url=url, nats_user="u", nats_password="p"))
    assert (userpass["user"], userpass["password"]) == ("u", "p") and "token" not in userpass
    creds = connect_options(CairnSettings(nats_url=url, nats_creds=str(tmp_path / "w.creds")))
    assert creds["user_credentials"].endswith("w.creds")
    anon = connect_options(CairnSettings(nats_url=url))
    assert not {"token", "user", "password", "user_credentials", "nkeys_seed_str"} & set(anon)


async def _refused(options: dict[str, Any]) -> None:
    """Connect with ``options``, closing the client whatever happens: nats-py leaves a refused
    connection's socket open otherwise."""
    nc = nats.NATS()
    try:
        await nc.connect(**options)
    finally:
        await nc.close()


def test_enrollment_token_authenticates_against_a_token_server() -> None:
    port = services.free_port()
    proc = subprocess.Popen([services.find_binary("nats-server"), "-a", "127.0.0.1", "-p", str(port),
                             "--auth", "enroll-SECRET"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        services.wait_for_port(port, proc)
        url = f"nats://127.0.0.1:{port}"
        good = NatsThread(CairnSettings(nats_url=url, worker_name=POOL, worker_enrollment_token="enroll-SECRET"))
        assert good.nc.is_connected
        good.close()
        settings = CairnSettings(nats_url=url, worker_name=POOL, worker_enrollment_token="wrong")
        options = {**connect_options(settings), "allow_reconnect": False, "connect_timeout": 1}
        with pytest.raises(Exception, match="Authorization Violation"):
            asyncio.run(_refused(options))
    finally:
        proc.terminate()
        proc.wait(10)


def test_publish_router_js_for_streams_core_otherwise_cached(thread: NatsThread) -> None:
    from nats.js.api import StreamConfig

    js, nc = thread.js, thread.nc
    thread.run(js.add_stream(StreamConfig(name="ROUTE_TEST", subjects=["route.js.>"], duplicate_window=60)), 5)
    router = PublishRouter(thread)
    assert router.stream_for("route.js.a") == "ROUTE_TEST"
    assert router.stream_for("route.core.a") is None
    lookups = router.lookups
    router.stream_for("route.js.a")
    assert router.lookups == lookups  # cached

    ack = router.publish("route.js.a", b"1", msg_id="m-1")
    dup = router.publish("route.js.a", b"1", msg_id="m-1")
    assert ack.stream == "ROUTE_TEST" and dup.duplicate and dup.seq == ack.seq

    got: list[Any] = []
    done = threading.Event()

    async def collect(msg: Any) -> None:
        got.append(msg)
        done.set()

    thread.run(nc.subscribe("route.core.>", cb=collect), 5)
    assert router.publish("route.core.a", b"hello", msg_id="m-2") is None  # core publish, no PubAck wait
    assert done.wait(5)
    assert got[0].data == b"hello" and got[0].headers["Nats-Msg-Id"] == "m-2"
    info = thread.run(js.stream_info("ROUTE_TEST"), 5)
    assert info.state.messages == 1


def test_presence_and_manifest_records_in_kv(thread: NatsThread) -> None:
    js = thread.js

    async def buckets() -> tuple[Any, Any]:
        return await core_bucket(js, subjects.PRESENCE_BUCKET), await core_bucket(js, subjects.MANIFEST_BUCKET)

    presence_kv, manifest_kv = thread.run(buckets(), 10)
    settings = CairnSettings(nats_url="nats://127.0.0.1:1", worker_name=POOL, instance_id="host-1-abcdef")
    ctx = presence.PresenceContext(settings=settings, nats=thread, provider=get_provider("strava", settings))

    written = presence.write_presence(ctx)
    entry = thread.run(presence_kv.get(f"{POOL}.host-1-abcdef"), 5)
    record = json.loads(entry.value)
    assert record == written
    assert set(record) == {"worker_name", "worker_key", "instance_id", "version", "release", "provider",
                           "package", "webhooks", "capabilities", "last_seen"}
    assert record["worker_key"] == f"{POOL}-strava" and record["instance_id"] == "host-1-abcdef"
    assert record["version"] == "1.1" and record["release"].startswith("v0.7.")
    assert record["package"] == settings.worker_package and record["webhooks"] is False
    assert record["capabilities"]["Activity"]["read"] is True and record["last_seen"].endswith("Z")

    manifest = presence.write_manifest(ctx)
    stored = json.loads(thread.run(manifest_kv.get(POOL), 5).value)
    assert stored == manifest
    assert {"worker_name", "version", "provider", "package", "updated_at", "capabilities",
            "provider_meta"} == set(stored)
    assert stored["capabilities"] == record["capabilities"] and "Gear" in stored["capabilities"]
    meta = stored["provider_meta"]
    assert meta["auth_method"] == "oauth2" and meta["oauth"]["scope_separator"] == ","
    assert [f["key"] for f in meta["config_fields"]] == ["client_id", "client_secret"]
