"""Reading a lease: its state comes from ``workers.lease`` (an enum), never from matching its text.

Against a real Redis. The bridge reads Cairn leases with an asyncio client and
classifies the raw value with ``view``; everyone else asks ``Leases.state``.
``grant_unless_running`` is how a bridge re-dispatches a redelivered job: it
replaces a dead sender's stale grant, and never a running execution (that one
is adopted).
"""

from __future__ import annotations

import redis

from workers.lease import Leases, LeaseState, granted, new_token, view


def test_states_through_their_whole_life(fresh_redis: str) -> None:
    leases = Leases(redis.Redis.from_url(fresh_redis), "test")
    token = new_token()
    assert leases.state("j").state is LeaseState.ABSENT
    leases.grant("j", token, 30.0)
    state = leases.state("j")
    assert state.state is LeaseState.GRANTED and state.held_by(token) and not state.held_by(new_token())
    running = leases.take("j", token, 30.0)
    assert running is not None
    state = leases.state("j")
    assert state.state is LeaseState.RUNNING and state.held_by(token)
    assert view(leases.holder("j")) == state  # the same reading from a raw value
    leases.release("j", running)
    assert leases.state("j").state is LeaseState.ABSENT


def test_a_stale_grant_is_replaced_but_a_running_lease_never(fresh_redis: str) -> None:
    leases = Leases(redis.Redis.from_url(fresh_redis), "test")
    stale, fresh, late = new_token(), new_token(), new_token()
    leases.grant("j", stale, 30.0)
    assert leases.grant_unless_running("j", fresh, 30.0)
    assert leases.take("j", stale, 30.0) is None  # the dead sender's queued task does nothing
    assert leases.take("j", fresh, 30.0) is not None
    assert not leases.grant_unless_running("j", late, 30.0)  # running: adopt it, never steal it
    assert leases.state("j").held_by(fresh)


def test_view_of_values_it_did_not_write() -> None:
    assert view(None).state is LeaseState.ABSENT and view(b"").state is LeaseState.ABSENT
    assert view(granted("t").encode()).token == "t"
    assert view("something-else").state is LeaseState.RUNNING  # unknown owner: never treated as free
