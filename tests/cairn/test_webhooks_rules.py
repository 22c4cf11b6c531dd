"""Strava's webhook rules and the generic wire pieces, without services: handshake replies, event
classification, the coalescing ids, the envelope decoder, and the handler's decisions that need no NATS."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from pydantic import SecretStr

from workers.cairn.handlers import webhooks as wh
from workers.providers.strava.webhooks import COALESCE_GRACE_S, StravaWebhookRules, StravaWebhookSettings

TOKEN = "verify-token-0123456789"


def rules(token: str | None = TOKEN, coalesce_s: float = 10.0) -> StravaWebhookRules:
    return StravaWebhookRules(StravaWebhookSettings(verify_token=SecretStr(token) if token else None,
                                                    coalesce_s=coalesce_s))


def event(**fields: Any) -> bytes:
    body = {"object_type": "activity", "object_id": 11, "aspect_type": "create", "owner_id": 7,
            "subscription_id": 99, "event_time": 1_000_003, "updates": {}} | fields
    return json.dumps(body).encode()


def envelope(body: bytes) -> bytes:
    return json.dumps({"provider": "p-strava", "headers": {"content-type": "application/json"},
                       "body": base64.b64encode(body).decode()}).encode()


def verify(r: Any, **query: str) -> dict[str, Any]:
    reply = json.loads(wh.verify_response(r, json.dumps({"method": "GET", "query": query}).encode()))
    reply["decoded"] = base64.b64decode(reply["body"])
    return reply


def test_verify_echoes_the_challenge_only_for_the_right_token() -> None:
    ok = verify(rules(), **{"hub.mode": "subscribe", "hub.challenge": "ch-1", "hub.verify_token": TOKEN})
    assert (ok["status"], ok["content_type"]) == (200, "application/json")
    assert json.loads(ok["decoded"]) == {"hub.challenge": "ch-1"}
    wrong = verify(rules(), **{"hub.mode": "subscribe", "hub.challenge": "c", "hub.verify_token": "nope"})
    assert wrong["status"] == 403 and TOKEN.encode() not in wrong["decoded"]
    assert verify(rules(), **{"hub.mode": "unsubscribe", "hub.verify_token": TOKEN})["status"] == 400
    assert verify(rules(token=None), **{"hub.mode": "subscribe", "hub.verify_token": ""})["status"] == 503
    assert verify(None)["status"] == 503  # a provider without webhook rules
    garbage = json.loads(wh.verify_response(rules(), b"\xff not json"))
    assert garbage["status"] == 400  # no query: no mode


def test_create_fetches_at_once_with_an_id_naming_the_event() -> None:
    job = wh.parse_event(envelope(event()), rules())
    assert (job.action, job.owner_id, job.object_id, job.subscription_id) == ("fetch", "7", "11", "99")
    assert job.tag == "c1000003" and job.not_before is None
    assert wh.webhook_job_id("strava", "pool", job.owner_id, job.object_id, job.tag) == \
        "webhook:strava:pool:7:11:c1000003"


def test_updates_in_one_bucket_share_an_id_and_wait_for_the_bucket_to_close() -> None:
    r = rules(coalesce_s=10.0)
    jobs = [wh.parse_event(envelope(event(aspect_type="update", event_time=t, updates=u)), r)
            for t, u in ((1_000_000, {"title": "a"}), (1_000_004, {"private": "true"}), (1_000_009, {"type": "Run"}))]
    assert {j.tag for j in jobs} == {"u1000000"}
    assert {j.not_before for j in jobs} == {1_000_010 + COALESCE_GRACE_S}
    later = wh.parse_event(envelope(event(aspect_type="update", event_time=1_000_010)), r)
    assert later.tag == "u1000010"  # the next bucket: a change after the fetch is fetched again


@pytest.mark.parametrize(("fields", "action"), [
    ({"aspect_type": "delete"}, "delete"),
    ({"object_type": "athlete", "object_id": 7, "aspect_type": "update", "updates": {"authorized": "false"}},
     "deauthorize"),
    ({"object_type": "athlete", "object_id": 7, "aspect_type": "update", "updates": {"name": "x"}}, "ignore"),
    ({"object_type": "club"}, "ignore"),
    ({"aspect_type": "archive"}, "ignore"),
])
def test_other_events(fields: dict[str, Any], action: str) -> None:
    assert wh.parse_event(envelope(event(**fields)), rules()).action == action


def test_a_subscription_id_of_zero_is_not_sent() -> None:
    assert wh.parse_event(envelope(event(subscription_id=0)), rules()).subscription_id == ""


@pytest.mark.parametrize("raw", [
    b"", b"[]", b"not json", json.dumps({"provider": "x"}).encode(),
    json.dumps({"provider": "x", "body": "!!not base64!!"}).encode(),
    envelope(b"not an event"), envelope(json.dumps({"object_type": "activity"}).encode()),
])
def test_undecodable_messages_raise_for_admission(raw: bytes) -> None:
    with pytest.raises(ValueError):
        wh.parse_event(raw, rules())


def test_a_pool_without_rules_refuses_every_event() -> None:
    with pytest.raises(ValueError):
        wh.parse_event(envelope(event()), None)


class NoCoreCtx:
    """A context whose core must not be asked: the handler decides before any request."""

    provider_name, worker_name, settings, nats = "strava", "pool", None, None

    def request(self, *_: Any, **__: Any) -> dict[str, Any]:
        raise AssertionError("no lookup expected")

    def publish(self, *_: Any, **__: Any) -> None:
        raise AssertionError("no publish expected")


def test_the_handler_acks_ignored_events_and_holds_an_open_bucket_without_asking_core() -> None:
    ignored = wh.WebhookJob(action="ignore", reason="athlete create")
    assert wh.handle_event(NoCoreCtx(), ignored.model_dump(), None).action == "ack"
    held = wh.WebhookJob(action="fetch", owner_id="7", object_id="11", tag="u100", not_before=112.0)
    disposition = wh.handle_event(NoCoreCtx(), held, None, now=lambda: 100.0)
    assert (disposition.action, disposition.delay_s, disposition.counts_as_failure) == ("nak", 12.0, False)
