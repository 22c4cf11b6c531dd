"""A JetStream publish that NATS does not acknowledge is retried with the same Nats-Msg-Id (R2, C4).

Found by ``python -m bench partitions`` (provider-nats): the provider host DROPped from
NATS mid-job. A result publish got no PubAck in time, so the task gave up and NAKed;
but the message was on its way (nats-py had it buffered, TCP retransmitted it after
the heal) and landed, and the redelivery ran the job again and published
``result:<job>:d2``: two deliveries' results for one job. An answerless publish is
retried within the delivery under the *same* msg id, for up to R1's minute (inside
JetStream's duplicate window): whichever copy lands first is the only one stored.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from nats.js.api import StreamConfig

from devstack.infra import services
from devstack.infra.procs import frozen
from tests.kit.cairn_ctx import core_bucket
from workers.cairn.nats_conn import NatsThread
from workers.cairn.routing import PublishError, PublishRouter
from workers.cairn.settings import CairnSettings

NATS_DOWN_S = 2.0  # the outage the publish must ride out
SHORT_BOUND_S = 1.0


@pytest.fixture()
def nats_svc() -> Iterator[services.Service]:
    with services.nats_server() as svc:
        yield svc


@pytest.fixture()
def thread(nats_svc: services.Service) -> Iterator[NatsThread]:
    conn = NatsThread(CairnSettings(nats_url=nats_svc.url, worker_name="retry-test"))
    conn.run(conn.js.add_stream(StreamConfig(name="RETRY_TEST", subjects=["retry.>"], duplicate_window=120)), 5)
    yield conn
    conn.close()


def stored(thread: NatsThread) -> int:
    return int(thread.run(thread.js.stream_info("RETRY_TEST"), 5).state.messages)


def test_a_publish_while_nats_is_down_lands_once_when_it_returns(nats_svc: services.Service,
                                                                  thread: NatsThread) -> None:
    router = PublishRouter(thread)
    assert router.stream_for("retry.a") == "RETRY_TEST"
    services.kill(nats_svc)
    back = threading.Timer(NATS_DOWN_S, services.start_again, args=[nats_svc])  # the outage itself
    back.start()
    try:
        ack = router.publish("retry.a", b"result", msg_id="result:job-r:d1", timeout_s=1.0)
    finally:
        back.join()
    assert ack.stream == "RETRY_TEST"
    assert stored(thread) == 1  # the buffered first attempt and the retry are one message


def test_without_a_msg_id_an_unanswered_publish_is_not_retried(nats_svc: services.Service,
                                                                thread: NatsThread) -> None:
    """No msg id, no dedup: a retry could store it twice, so the failure goes to the caller (a NAK)."""
    router = PublishRouter(thread)
    assert router.stream_for("retry.b") == "RETRY_TEST"
    services.kill(nats_svc)
    try:
        with pytest.raises(PublishError):
            router.publish("retry.b", b"x", msg_id=None, timeout_s=0.5)
    finally:
        services.start_again(nats_svc)


def test_the_retry_is_bounded(nats_svc: services.Service, thread: NatsThread) -> None:
    router = PublishRouter(thread, retry_bound_s=SHORT_BOUND_S)
    assert router.stream_for("retry.c") == "RETRY_TEST"
    services.kill(nats_svc)
    try:
        with pytest.raises(PublishError):
            router.publish("retry.c", b"x", msg_id="result:job-c:d1", timeout_s=0.5)
    finally:
        services.start_again(nats_svc)


def test_a_presign_while_nats_is_down_is_answered_when_it_returns(nats_svc: services.Service,
                                                                   thread: NatsThread) -> None:
    """The partial publish the partition left: an activity result stored, its segment companion's
    presign unanswered, the delivery NAKed and run again (both results stored twice). Presigning is
    idempotent: an unanswered one is asked again until NATS is back, within the same delivery."""
    from workers.cairn.claimcheck import ClaimCheck, WorkerStamp

    async def answer(msg: Any) -> None:
        await msg.respond(json.dumps({"url": "http://127.0.0.1:9/x", "blob_id": "transfer/strava/x.json",
                                      "required_headers": {}, "expires_at": "2099-01-01T00:00:00Z"}).encode())

    thread.run(thread.nc.subscribe("cairn.blobs.presign_download.*", cb=answer), 5)
    check = ClaimCheck(thread, provider="strava", stamp=WorkerStamp("retry-test", "1", "t"), presign_timeout_s=0.5)
    services.kill(nats_svc)
    back = threading.Timer(NATS_DOWN_S, services.start_again, args=[nats_svc])  # the outage itself
    back.start()
    try:
        reply = check.presign_download("transfer/strava/x.json")
    finally:
        back.join()
    assert reply.url == "http://127.0.0.1:9/x"


def test_a_budget_reservation_nats_cannot_answer_is_transient_not_unexpected(
        nats_svc: services.Service, thread: NatsThread, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by bench partitions (provider-nats): a rate-limit reservation whose KV call timed out raised a
    bare TimeoutError, which the job's disposition took for an unexpected bug (a 30 s NAK counted toward
    the job's termination), so a long enough partition would have termed good jobs with an envelope.
    A frozen nats-server (SIGSTOP) is what a DROP looks like from the client: connected, no answer."""
    from workers.cairn import ratelimit
    from workers.cairn.contract import subjects
    from workers.cairn.ratelimit import BudgetUnavailable, RateLimiter
    from workers.providers.strava.usage import RATE_WINDOWS

    monkeypatch.setattr(ratelimit, "KV_TIMEOUT_S", SHORT_BOUND_S)  # the wait for an answer, not what it proves

    thread.run(core_bucket(thread.js, subjects.RATE_LIMIT_BUCKET), 5)
    limiter = RateLimiter(thread, CairnSettings(nats_url=nats_svc.url, worker_name="retry-test"), RATE_WINDOWS)
    limiter.reserve_all("app", ["daily", "short"])  # the bucket opened while NATS answers
    assert nats_svc.proc is not None
    with frozen(nats_svc.proc.pid), pytest.raises(BudgetUnavailable):
        limiter.reserve_all("app", ["daily", "short"])
