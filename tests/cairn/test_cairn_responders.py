"""The discover (§8) and OAuth exchange (§9b) responders always answer, exactly once.

Property tests: arbitrary bytes and arbitrary JSON (deep nesting, huge strings,
invalid UTF-8, NaN, wrong types) sent to the bridge's real ``Responders`` on a
real nats-server, with the real result waiter on a real Redis and a Celery
app no worker consumes (so a well-formed request meets its deadline). Every
request must get one JSON object reply carrying ``error`` — ``bad_request``
whenever the request itself is malformed — and nothing may escape.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import nats
import pytest
import redis
from celery import Celery
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridges.cairn.responders import (
    BadRequest,
    PoolCalls,
    ResponderConfig,
    Responders,
    discover_request,
    exchange_request,
)
from bridges.cairn.results import TaskResults

DEADLINE_S = 0.3  # nobody serves the pool here: a well-formed request ends in its deadline error
REPLY_WAIT_S = 5.0
EXTRA_REPLY_WAIT_S = 0.3  # after the last reply: a second answer to any request would arrive within this
DEEP = 100_000
NATS_MAX_BODY = 900_000  # nats-server's default max_payload is 1 MiB: what a requester can send at all
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])

_scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
            | st.text(max_size=20))
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=10)
_fields = st.fixed_dictionaries({}, optional={
    "account_id": _scalars, "start_page": _scalars | st.just(1e400), "client_id": _scalars,
    "client_secret": _scalars, "code": _scalars, "redirect_uri": _scalars, "code_verifier": _json,
    "connection_id": _scalars})
_bodies = st.one_of(
    st.binary(max_size=200),
    _json.map(lambda v: json.dumps(v).encode()),
    _fields.map(lambda v: json.dumps(v).encode()),
    st.integers(1, DEEP).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, DEEP).map(lambda n: b'{"account_id": ' * n + b"1" + b"}" * n),
    st.integers(10_000, 200_000).map(lambda n: json.dumps({"account_id": "a" * n, "code": "c" * n}).encode()),
    st.binary(min_size=1, max_size=30).map(lambda b: b'{"account_id": "' + b + b'"}'),
)


# --------------------------------------------------------------------------- the request checks
@settings(max_examples=300, deadline=None)
@given(body=_bodies)
def test_request_checks_return_a_request_or_bad_request_and_nothing_else(body: bytes) -> None:
    for check in (discover_request, exchange_request):
        try:
            request = check(body)
        except BadRequest as exc:
            assert str(exc) and len(str(exc)) < 200
            continue
        json.dumps(request)  # what travels to the pool is plain JSON
        assert all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in request.values())


def test_a_secret_is_never_quoted_in_a_bad_request() -> None:
    secret = f"secret-{uuid.uuid4().hex}"
    with pytest.raises(BadRequest) as caught:
        exchange_request(json.dumps({"client_id": ["x"], "client_secret": secret, "code": secret}).encode())
    assert secret not in str(caught.value)


# --------------------------------------------------------------------------- the responders on NATS
class Pool:
    """One bridge's responders on the session nats-server, the pool unreachable."""

    def __init__(self, nats_url: str, redis_url: str) -> None:
        self.nats_url, self.redis_url = nats_url, redis_url
        name = f"fuzz-{uuid.uuid4().hex[:6]}"
        self.discover_subject = f"cairn.discover.strava.{name}"
        self.exchange_subject = f"cairn.oauth.strava.{name}.exchange"
        self.app = Celery("responders-fuzz", broker=redis_url, backend=redis_url)

    def _send(self, name: str) -> Any:
        def send(arg: Any, task_id: str, expires_s: float) -> None:
            self.app.send_task(name, args=[arg], task_id=task_id, expires=expires_s)
        return send

    async def ask(self, bodies: list[tuple[str, bytes]]) -> dict[str, list[bytes]]:
        """Send every request and collect every reply, per request."""
        nc = await nats.connect(self.nats_url)
        results = TaskResults(self.app.backend, self.redis_url)
        spawned: set[asyncio.Task[Any]] = set()

        def spawn(coro: Any, name: str) -> asyncio.Task[Any]:
            task = asyncio.create_task(coro, name=name)
            spawned.add(task)
            return task

        config = ResponderConfig(self.discover_subject, self.exchange_subject, "fuzz", DEADLINE_S, DEADLINE_S)
        pool = PoolCalls(results, self._send("cairn.discover"), self._send("cairn.exchange"))
        responders = Responders(nc, config, pool, redis.Redis.from_url(self.redis_url), spawn)
        replies: dict[str, list[bytes]] = {}
        inbox = f"_INBOX.fuzz.{uuid.uuid4().hex}"

        async def collect(msg: Any) -> None:
            replies.setdefault(msg.subject, []).append(msg.data)

        try:
            await results.start()
            await responders.start()
            await nc.subscribe(f"{inbox}.*", cb=collect)
            for i, (subject, body) in enumerate(bodies):
                await nc.publish(subject, body, reply=f"{inbox}.{i}")
            deadline = asyncio.get_running_loop().time() + REPLY_WAIT_S + DEADLINE_S * len(bodies)
            while len(replies) < len(bodies) and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)  # replies arrive through the callback; nothing else to await
            await asyncio.sleep(EXTRA_REPLY_WAIT_S)  # room for a second answer, which must not come
            return {f"{i}": replies.get(f"{inbox}.{i}", []) for i in range(len(bodies))}
        finally:
            await responders.stop()
            await asyncio.gather(*spawned, return_exceptions=True)
            assert all(not t.cancelled() and t.exception() is None for t in spawned)  # nothing escaped
            await results.close()
            await nc.close()


@pytest.fixture()
def pool(nats_url: str, fresh_redis: str) -> Iterator[Pool]:
    yield Pool(nats_url, fresh_redis)


@FUZZ
@given(bodies=st.lists(_bodies.filter(lambda b: len(b) <= NATS_MAX_BODY), min_size=1, max_size=4))
def test_every_request_gets_exactly_one_error_reply(pool: Pool, bodies: list[bytes]) -> None:
    requests = [(s, b) for b in bodies for s in (pool.discover_subject, pool.exchange_subject)]
    replies = asyncio.run(pool.ask(requests))
    for i, (subject, body) in enumerate(requests):
        (raw,) = replies[str(i)]  # exactly one answer
        reply = json.loads(raw)
        assert isinstance(reply, dict) and reply.get("error"), reply
        assert "items" not in reply and "access_token" not in reply
        is_discover = subject == pool.discover_subject
        try:
            (discover_request if is_discover else exchange_request)(body)
        except BadRequest:
            assert reply["error"] == "bad_request", reply


def test_a_deeply_nested_request_gets_bad_request_from_both(pool: Pool) -> None:
    body = b"[" * (NATS_MAX_BODY // 2) + b"]" * (NATS_MAX_BODY // 2)
    replies = asyncio.run(pool.ask([(pool.discover_subject, body), (pool.exchange_subject, body)]))
    assert [json.loads(r[0])["error"] for r in replies.values()] == ["bad_request", "bad_request"]
