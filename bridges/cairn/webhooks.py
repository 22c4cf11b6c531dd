"""The pool's webhook intake, plugged into the bridge: one more consumer kind and one more responder."""

from __future__ import annotations

from typing import Any

from bridges.cairn.admission import MessageKind
from bridges.cairn.bridge import Consumption, Reply
from bridges.cairn.consumers import JobConsumer
from workers.cairn.contract import subjects
from workers.cairn.handlers import webhooks as wh
from workers.providers.base import Provider

STREAM_WEBHOOKS = subjects.WEBHOOKS_STREAM



def webhook_consumer(settings: Any) -> JobConsumer:
    """``<worker_name>__webhook_event`` on ``CAIRN_WEBHOOKS``, filtered on ``cairn.webhooks.<worker_key>.event``.

    Shared by every instance (a work queue, like ``CAIRN_JOBS``); its messages go through the
    same admission, ledger, lease, failure count and settle as jobs (contract §9a).
    """
    key = subjects.worker_key(settings.worker_name, settings.provider)
    return JobConsumer(wh.KIND, subjects.webhook_event_subject(key),
                       subjects.webhook_durable_name(settings.worker_name), STREAM_WEBHOOKS)


def consumptions(settings: Any, provider: Provider) -> list[Consumption]:
    """The webhook consumer and its admission parser, or nothing while webhooks are off.

    An undecodable event is poison: a term without a failure envelope, since a webhook event
    has no import-queue item and no result subject.
    """
    rules = provider.webhook_rules()
    if rules is None or not rules.enabled:
        return []
    # No failure envelope: contract §6's envelope exists to fail an import-queue item, and a webhook
    # event has none; nor does any contract section give it a result subject (the template grants
    # none: cairn.results.webhook_event.* would be refused). Reference §3.14: undecodable → Term.
    kind = MessageKind(wh.KIND, parse=lambda raw: wh.parse_event(raw, rules), envelopes=False)
    return [(webhook_consumer(settings), kind)]


def replies(settings: Any, provider: Provider) -> list[Reply]:
    """The verify responder, whenever the provider has webhook rules (503 without a token).

    Strava's handshake relayed by core, answered in the bridge (no provider call, no secret
    leaves it): 200 with the challenge, 403 on a wrong token, 503 unconfigured, so core relays a
    clear refusal instead of its own timeout.
    """
    rules = provider.webhook_rules()
    if rules is None:
        return []
    key = subjects.worker_key(settings.worker_name, settings.provider)
    return [(subjects.webhook_verify_subject(key), settings.worker_name,
             lambda data: wh.verify_response(rules, data))]
