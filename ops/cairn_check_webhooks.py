"""``switchyard check cairn --webhooks``: the pool's webhook checks (issue 10), one entry of ``CHECKS``.

Three checks, in the ``check cairn`` report format:

* **consumer** — a durable on CAIRN_WEBHOOKS filtered on
  ``cairn.webhooks.<worker_key>.event`` exists (else the provider's events pile
  up in the work queue for 24 h and are lost);
* **verify** — a relayed handshake on ``cairn.webhooks.<worker_key>.verify``
  gets a well-formed ``{status, content_type, body (base64)}``. With the
  pool's token (``--verify-token``, else the one the provider's own webhook
  rules are configured with here: ``Provider.webhook_rules().handshake_token()``)
  it must be 200 and echo the challenge; without, a deliberately wrong token
  must get 403 (the responder runs and checks tokens). A JetStream PubAck as
  the reply means CAIRN_WEBHOOKS also captures ``.verify`` (reference §2.1):
  core would relay it to the provider and the subscription would fail;
* **presence** — the pool's presence record says ``"webhooks": true``.

Registration: :func:`add_arguments` (``ops.commands.check``) and
:func:`check_webhooks` (in ``ops.cairn_check.CHECKS``; it does nothing
without ``--webhooks``). It reads ``probe.options.webhooks``/``verify_token``
and the presence record the presence check stored on the probe.
"""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any

from workers.cairn.contract import subjects
from workers.errors import ConfigError
from workers.providers.registry import get_provider

CHALLENGE_BYTES = 9


class WebhookCheckFailed(Exception):
    pass


def add_arguments(parser: Any) -> None:
    parser.add_argument("--webhooks", action="store_true",
                        help="also check the webhook consumer, the verify responder and presence")
    parser.add_argument("--verify-token", default=None,
                        help="the pool's handshake token (default: the one the provider's webhook settings hold "
                             "here, e.g. CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN; without one a wrong token must be "
                             "refused with 403)")


def configured_token(provider: str) -> str | None:
    """The handshake token the provider's webhook rules are configured with in this environment, or None
    (no rules, none configured, or a provider this installation cannot build: the check then offers a
    wrong token and expects 403)."""
    try:
        rules = get_provider(provider).webhook_rules()
    except ConfigError:
        return None
    return rules.handshake_token() if rules is not None else None


async def _consumer(js: Any, key: str) -> None:
    wanted = subjects.webhook_event_subject(key)
    try:
        infos = await js.consumers_info(subjects.WEBHOOKS_STREAM)
    except Exception as exc:  # noqa: BLE001
        raise WebhookCheckFailed(f"cannot list consumers on {subjects.WEBHOOKS_STREAM}: {type(exc).__name__}") from None
    for info in infos:
        filters = [s for s in [info.config.filter_subject, *(info.config.filter_subjects or [])] if s]
        if wanted in filters:
            return
    raise WebhookCheckFailed(f"no consumer on {subjects.WEBHOOKS_STREAM} for {wanted}")


async def _verify(nc: Any, key: str, token: str | None, timeout_s: float) -> None:
    challenge = secrets.token_urlsafe(CHALLENGE_BYTES)
    offered = token or "switchyard-check-wrong-" + secrets.token_hex(4)
    request = {"method": "GET", "query": {"hub.mode": "subscribe", "hub.challenge": challenge,
                                          "hub.verify_token": offered}}
    subject = subjects.webhook_verify_subject(key)
    try:
        msg = await nc.request(subject, json.dumps(request).encode(), timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001
        raise WebhookCheckFailed(f"no reply on {subject} ({type(exc).__name__})") from None
    try:
        reply = json.loads(msg.data)
    except ValueError:
        raise WebhookCheckFailed("reply is not JSON") from None
    if isinstance(reply, dict) and "stream" in reply and "seq" in reply:
        raise WebhookCheckFailed("got a JetStream PubAck: CAIRN_WEBHOOKS captures .verify (reference §2.1)")
    if not isinstance(reply, dict) or not {"status", "content_type", "body"} <= set(reply):
        raise WebhookCheckFailed("reply lacks status/content_type/body")
    try:
        body = base64.b64decode(str(reply["body"]), validate=True)
    except ValueError:
        raise WebhookCheckFailed("reply body is not base64") from None
    status = int(reply["status"] or 200)
    if token is None:
        if status != 403:
            raise WebhookCheckFailed(f"a wrong verify token got {status}, expected 403"
                                     + (" (no token configured on the pool)" if status == 503 else ""))
        return
    if status != 200:
        raise WebhookCheckFailed(f"the verify token got {status}, expected 200")
    try:
        echoed = json.loads(body).get("hub.challenge")
    except (ValueError, AttributeError):
        echoed = None
    if echoed != challenge:
        raise WebhookCheckFailed("the reply does not echo hub.challenge")


async def check_webhooks(probe: Any, report: Any) -> None:
    """The three checks on ``probe`` (``ops.cairn_check.Probe``), recorded on ``report``."""
    options = probe.options
    if not getattr(options, "webhooks", False):
        return
    key = subjects.worker_key(options.worker_name, options.provider)
    token = getattr(options, "verify_token", None) or configured_token(options.provider)
    checks = (("webhook consumer", _consumer(probe.js, key)),
              ("webhook verify", _verify(probe.nc, key, token, options.timeout_s)))
    for name, check in checks:
        try:
            await check
            report.record(name, None)
        except WebhookCheckFailed as exc:
            report.record(name, str(exc))
    presence = probe.presence
    if presence is None:
        report.record("presence says webhooks", "no presence record")
    elif presence.get("webhooks") is not True:
        report.record("presence says webhooks", f"webhooks is {presence.get('webhooks')!r}")
    else:
        report.record("presence says webhooks", None)
