"""Leases decide who owns a job (V2): tested against a real redis-server."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from devstack.infra import services
from tests.kit.waiting import wait_until
from workers.lease import LeaseKeeper, Leases, new_token


@pytest.fixture()
def leases(fresh_redis: str) -> Iterator[Leases]:
    """Leases on the test's fresh Redis. Its client is closed after the test: a keeper never started
    holds it in a reference cycle, whose socket would otherwise stay open until a collection."""
    client = redis.Redis.from_url(fresh_redis)
    yield Leases(client, "test")
    client.close()


def _running(leases: Leases, job_id: str, ttl_s: float) -> str:
    """A lease granted and taken at once, as a task takes its job: the running value."""
    token = new_token()
    leases.grant(job_id, token, ttl_s)
    running = leases.take(job_id, token, ttl_s)
    assert running
    return running


def test_only_one_execution_takes_a_granted_lease(leases: Leases) -> None:
    token = new_token()
    leases.grant("job1", token, 30)
    winners: list[str] = []
    barrier = threading.Barrier(8)

    def contender() -> None:
        barrier.wait()
        value = leases.take("job1", token, 30)
        if value:
            winners.append(value)

    threads = [threading.Thread(target=contender) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert leases.holder("job1") == winners[0]


def test_a_grant_is_replaced_only_while_it_still_names_the_old_token(leases: Leases) -> None:
    """The grant audit's compare-and-set: a task that took its grant keeps it; a late old task finds it gone."""
    old, new, other = new_token(), new_token(), new_token()
    leases.grant("jobr", old, 3600)
    assert leases.replace_grant("jobr", old, new, 30)
    assert leases.holder("jobr") == f"granted:{new}"
    assert 0 < leases._r.pttl(leases.key("jobr")) <= 30_000  # pending again: confirmed after its send
    assert leases.take("jobr", old, 30) is None  # the stranded task, delivered late, does nothing
    assert not leases.replace_grant("jobr", old, other, 30)
    running = leases.take("jobr", new, 30)
    assert running and not leases.replace_grant("jobr", new, other, 30)  # taken: never replaced
    assert leases.holder("jobr") == running
    states = leases.states_with_ttl(["jobr", "absent"])
    assert [v.state.value for v, _ in states] == ["running", "absent"]
    assert 0 < states[0][1] <= 30_000 and states[1][1] < 0


def test_wrong_token_cannot_take_and_hand_over_requires_the_running_value(leases: Leases) -> None:
    token = new_token()
    leases.grant("job2", token, 30)
    assert leases.take("job2", new_token(), 30) is None
    running = leases.take("job2", token, 30)
    assert running is not None
    nxt = new_token()
    assert not leases.hand_over("job2", "running:someone-else", nxt, 30)
    assert leases.hand_over("job2", running, nxt, 30)
    assert leases.holder("job2") == f"granted:{nxt}"
    # the old running value can no longer renew or release
    assert not leases.renew("job2", running, 30)
    assert not leases.release("job2", running)


def test_grant_only_if_absent_never_steals(leases: Leases) -> None:
    leases.grant("job3", "a", 30)
    assert not leases.grant("job3", "b", 30, only_if_absent=True)
    assert leases.holder("job3") == "granted:a"


def test_keeper_renews_and_lease_expires_without_it(leases: Leases, fresh_redis: str) -> None:
    client = redis.Redis.from_url(fresh_redis)
    running = _running(leases, "job4", 0.3)
    with LeaseKeeper(leases, "job4", running, 0.3) as keeper:
        # outlive three TTLs while the keeper renews
        assert not keeper.lost.wait(1.0)
        assert leases.alive("job4")
    ttl_ms = client.pttl(leases.key("job4"))
    assert 0 < ttl_ms <= 300
    # without renewals it expires: wait on the key's own TTL, not a guess
    threading.Event().wait(ttl_ms / 1000 + 0.1)
    assert not leases.alive("job4")


def test_keeper_reports_a_lost_lease(leases: Leases) -> None:
    running = _running(leases, "job5", 0.3)
    with LeaseKeeper(leases, "job5", running, 0.3) as keeper:
        leases.grant("job5", "someone-else", 30)  # the reaper re-granted it
        assert keeper.lost.wait(2.0)


@pytest.mark.parametrize("end", ["release", "hand_over"])
def test_a_lease_the_body_ended_itself_is_not_reported_lost(leases: Leases, end: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """A transcription releases its lease when it is done, a download hands it over, both while the
    keeper still runs: its next renewal finds the lease gone, and that is no loss (the log budget
    found "lease lost" after every such race in a plain run)."""
    running = _running(leases, "job7", 0.3)
    with caplog.at_level(logging.WARNING, logger="workers.lease"):
        with LeaseKeeper(leases, "job7", running, 0.3) as keeper:
            if end == "release":
                assert leases.release("job7", running)
            else:
                assert leases.hand_over("job7", running, "next-token", 30)
            assert not keeper.lost.wait(1.0)  # three renewal intervals and more
    assert "lease lost" not in caplog.text


@pytest.mark.parametrize("end", ["release", "hand_over"])
def test_a_renewal_between_the_ends_write_and_its_reply_is_no_loss(leases: Leases, end: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The keeper's thread renews while the body's end is on the wire: Redis runs the end, then the
    renewal, and only then does the end's reply come back. The renewal finds the lease changed; the
    end is this process's own, so it is no loss."""
    running = _running(leases, "job8", 30)
    keeper = LeaseKeeper(leases, "job8", running, 30)  # its thread never started: the renewal is ours to place
    script = "_release" if end == "release" else "_take"
    real = getattr(leases, script)
    renewed: list[bool] = []

    def then_the_renewal(*args: object, **kwargs: object) -> object:
        answer = real(*args, **kwargs)  # the end has landed in Redis ...
        renewed.append(keeper.held())  # ... and the keeper's renewal lands before its reply is read
        return answer

    setattr(leases, script, then_the_renewal)
    with caplog.at_level(logging.WARNING, logger="workers.lease"):
        ended = leases.release("job8", running) if end == "release" else leases.hand_over("job8", running, "next", 30)
    assert ended and renewed == [False]  # the renewal found the lease changed ...
    assert not keeper.lost.is_set()  # ... and knew the end was this process's own
    assert "lease lost" not in caplog.text


def test_an_end_redis_refused_is_not_remembered(leases: Leases) -> None:
    """A release of a lease that is no longer ours ends nothing here: the keeper reports the loss."""
    running = _running(leases, "job9", 30)
    leases.grant("job9", "someone-else", 30)  # the reaper re-granted it
    assert not leases.release("job9", running)
    assert not leases.ended_here("job9", running)
    keeper = LeaseKeeper(leases, "job9", running, 30)
    assert not keeper.held() and keeper.lost.is_set()


def test_confirm_extends_only_a_matching_grant(leases: Leases, fresh_redis: str) -> None:
    """Phase two of a grant: a pending grant is extended; nothing else is touched or created."""
    client = redis.Redis.from_url(fresh_redis)
    pending_s, queued_s = 2.0, 6 * 3600.0
    token = new_token()
    leases.grant("job6", token, pending_s)
    assert 0 < client.pttl(leases.key("job6")) <= pending_s * 1000
    assert leases.confirm("job6", token, queued_s)
    assert client.pttl(leases.key("job6")) > pending_s * 1000
    assert leases.holder("job6") == f"granted:{token}"

    # another token's grant (the reaper re-granted an expired one): neither extended nor changed
    mine, theirs = new_token(), new_token()
    leases.grant("job7", theirs, pending_s)
    assert not leases.confirm("job7", mine, queued_s)
    assert leases.holder("job7") == f"granted:{theirs}"
    assert client.pttl(leases.key("job7")) <= pending_s * 1000

    # the task already took its grant: the running lease keeps its own TTL
    token8 = new_token()
    leases.grant("job8", token8, pending_s)
    running = leases.take("job8", token8, pending_s)
    assert running
    assert not leases.confirm("job8", token8, queued_s)
    assert leases.holder("job8") == running
    assert client.pttl(leases.key("job8")) <= pending_s * 1000

    # a grant that is gone (expired, or the job already ended) is not recreated
    assert not leases.confirm("job9", new_token(), queued_s)
    assert not leases.alive("job9")


# --------------------------------------------------------------- a take across a Redis outage
OUTAGE_SEEN_S = 10.0


def test_a_take_waits_out_a_redis_outage_instead_of_stranding_the_grant(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A task acked by Celery whose take hits a dead Redis must take the job once Redis is back.

    Raising instead (what a Sentinel failover under load did) leaves the job granted for the
    queued TTL to a task that no longer exists: nobody runs it and the reaper never sees it.
    """
    svc = services.start_redis(tmp_path, appendonly=True, appendfsync="always")
    try:
        leases = Leases(redis.Redis.from_url(svc.url, socket_connect_timeout=0.5), "outage")
        token = new_token()
        leases.grant("job-o", token, 60)
        services.kill(svc)
        result: list[str | None] = []
        taker = threading.Thread(target=lambda: result.append(leases.take("job-o", token, 30)))
        taker.start()
        wait_until(lambda: not taker.is_alive() or "when taking its lease" in caplog.text, OUTAGE_SEEN_S,
                   "the take to meet the outage")
        assert taker.is_alive(), "the take gave up while Redis was down"
        services.start_again(svc)
        taker.join(OUTAGE_SEEN_S * 2)
        assert result and result[0] is not None, "the take did not get the job after Redis came back"
        assert leases.holder("job-o") == result[0]
    finally:
        svc.stop()


def test_a_take_whose_reply_was_lost_is_still_this_executions(fresh_redis: str) -> None:
    """The take's write lands and its reply is lost (the connection drops in between, as when a
    master dies): the retry, redis-py's or the take's own, finds its own running value there and
    must not read it as another owner's, or the job is left running for nobody."""
    port = int(fresh_redis.rsplit(":", 1)[1].split("/")[0])
    with ReplyDropper(port) as relay:
        leases = Leases(redis.Redis(port=relay.port), "lost-reply")
        warm, token = new_token(), new_token()
        leases.grant("job-w", warm, 60)
        assert leases.take("job-w", warm, 30)  # the script is loaded: the next take is one EVALSHA
        leases.grant("job-r", token, 60)
        relay.drop_next_reply.set()
        taken = leases.take("job-r", token, 30)
        assert relay.dropped, "no reply was dropped: the test proved nothing"
    assert taken is not None, "the retried take mistook its own landed write for another owner"
    assert leases.holder("job-r") == taken


class ReplyDropper:
    """A loopback relay to Redis that can cut a connection between a command's run and its reply."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.drop_next_reply = threading.Event()
        self.dropped = False

    def __enter__(self) -> ReplyDropper:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._upstream_port))
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if replies and self.drop_next_reply.is_set():
                    self.drop_next_reply.clear()
                    self.dropped = True
                    break
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
