"""Request/reply responders of the dev core (reference §2.4-§2.8, 0.7 subjects).

Plain core-NATS subscriptions without queue groups, like core. Provider comes
from the subject (0.7): an account or blob key of another provider in the body
is refused. Token, creds and lookup handlers always answer JSON with an
``error`` field; presign handlers answer errors as plain text with a
``Nats-Error`` header (the published behaviour). Faults can be injected per
responder so worker tests can exercise ``transient`` replies and timeouts.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nats.aio.msg import Msg

from devstack.fakes.cairn_core.accounts import STATUS_ACTIVE, STATUS_NEEDS_REAUTH, Account, AccountRegistry, is_uuid
from devstack.fakes.cairn_core.blobs import BlobStore, PresignError, key_provider_ok

ZERO_TIME = "0001-01-01T00:00:00Z"  # Go zero time, sent as expires_at on token errors
TRANSIENT_RETRY_AFTER_S = 30
DEFAULT_REAUTH_REASON = "refresh_failed"
_FRACTION = re.compile(r"(?<=:\d\d)(\.\d+)")  # Go writes up to 9 digits; Python reads 6
RESPONDERS = ("tokens.get", "tokens.store", "tokens.needs_reauth", "creds.get",
              "presign_upload", "presign_download", "accounts.lookup")


def rfc3339(ts: datetime | None) -> str:
    if ts is None:
        return ZERO_TIME
    ts = ts.astimezone(UTC)
    return ts.strftime("%Y-%m-%dT%H:%M:%S") + (f".{ts.microsecond:06d}".rstrip("0") if ts.microsecond else "") + "Z"


def parse_rfc3339(text: object) -> datetime | None:
    """Parse an RFC 3339 timestamp with a zone (Go accepts up to 9 fractional digits)."""
    if not isinstance(text, str) or not text:
        return None
    value = _FRACTION.sub(lambda m: m.group(1)[:7], text.strip()).replace("Z", "+00:00").replace("z", "+00:00")
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError("timestamp without zone")
    parsed = parsed.astimezone(UTC)
    return None if parsed.year <= 1 else parsed


@dataclass
class Fault:
    reply: dict[str, Any] | None  # None with drop=False → no fault
    drop: bool
    times: int


class Responders:
    """Handlers for every responder subject; ``publish_event`` emits needs_reauth events."""

    def __init__(self, accounts: AccountRegistry, blobs: BlobStore, publish_event: Any) -> None:
        self.accounts, self.blobs, self.publish_event = accounts, blobs, publish_event
        self._lock = threading.Lock()
        self._faults: dict[str, list[Fault]] = {}
        self.calls: list[tuple[str, str]] = []  # (responder, subject), no bodies: they hold secrets

    def inject(self, responder: str, reply: dict[str, Any] | None = None, *, drop: bool = False,
               times: int = 1) -> None:
        if responder not in RESPONDERS:
            raise ValueError(f"unknown responder {responder!r}, expected one of {RESPONDERS}")
        with self._lock:
            self._faults.setdefault(responder, []).append(Fault(reply, drop, times))

    def _fault(self, responder: str) -> Fault | None:
        with self._lock:
            queue = self._faults.get(responder) or []
            if not queue:
                return None
            fault = queue[0]
            fault.times -= 1
            if fault.times <= 0:
                queue.pop(0)
            return fault

    async def _reply(self, msg: Msg, body: dict[str, Any]) -> None:
        if msg.reply:
            await msg.respond(json.dumps(body).encode())

    async def _error(self, msg: Msg, text: str) -> None:
        if msg.reply:
            await msg._client.publish(msg.reply, text.encode(), headers={"Nats-Error": text})

    async def _serve(self, responder: str, msg: Msg) -> dict[str, Any] | None:
        """Common prologue: record the call, apply an injected fault, decode the body."""
        self.calls.append((responder, msg.subject))
        fault = self._fault(responder)
        if fault is not None:
            if not fault.drop and fault.reply is not None:
                await self._reply(msg, fault.reply)
            return None
        try:
            body = json.loads(msg.data or b"null")
        except ValueError:
            body = None
        return body if isinstance(body, dict) else {}

    # ---- tokens ----------------------------------------------------------------------------
    async def tokens(self, msg: Msg) -> None:
        """``cairn.tokens.<provider>.{get,store,needs_reauth}``."""
        parts = msg.subject.split(".")
        provider, op = parts[2], parts[3]
        handler = {"get": self._token_get, "store": self._token_store, "needs_reauth": self._needs_reauth}.get(op)
        body = await self._serve(f"tokens.{op}", msg)
        if body is None or handler is None:
            return
        await self._reply(msg, await handler(provider, body))

    async def _token_get(self, provider: str, body: dict[str, Any]) -> dict[str, Any]:
        if not is_uuid(body.get("account_id")):
            return {"expires_at": ZERO_TIME, "error": "bad_request"}
        acct = self.accounts.for_provider(body["account_id"], provider)
        if acct is None or acct.status != STATUS_ACTIVE or not acct.access_token:
            return {"expires_at": ZERO_TIME, "error": "account_gone"}
        reply = {"access_token": acct.access_token, "refresh_token": acct.refresh_token or "",
                 "expires_at": rfc3339(acct.expires_at), "scope": acct.scope, "token_type": "Bearer",
                 "client_id": acct.client_id, "client_secret": acct.client_secret}
        if acct.app_id:
            reply["app_id"] = acct.app_id
        return reply

    async def _token_store(self, provider: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            expires = parse_rfc3339(body.get("expires_at"))
            previous = parse_rfc3339(body.get("previous_expires_at"))
        except ValueError:
            return {"ok": False, "error": "bad_request"}
        if not is_uuid(body.get("account_id")) or not body.get("access_token") or expires is None:
            return {"ok": False, "error": "bad_request"}
        acct = self.accounts.for_provider(body["account_id"], provider)
        if acct is None or acct.status != STATUS_ACTIVE:
            return {"ok": False, "error": "account_gone"}
        stored = acct.expires_at
        if stored is not None and (previous is None or stored > previous):
            return {"ok": False, "error": "stale_store"}
        acct.access_token, acct.expires_at = body["access_token"], expires
        acct.refresh_token = body.get("refresh_token") or acct.refresh_token
        acct.scope = body.get("scope") or acct.scope
        return {"ok": True}

    async def _needs_reauth(self, provider: str, body: dict[str, Any]) -> dict[str, Any]:
        if not is_uuid(body.get("account_id")):
            return {"ok": False, "error": "bad_request"}
        acct = self.accounts.for_provider(body["account_id"], provider)
        if acct is None:
            return {"ok": False, "error": "bad_request"}
        reason = body.get("reason") or DEFAULT_REAUTH_REASON
        acct.status, acct.needs_reauth_reason = STATUS_NEEDS_REAUTH, reason
        await self.publish_event(acct, reason)
        return {"ok": True}

    # ---- creds -----------------------------------------------------------------------------
    async def creds(self, msg: Msg) -> None:
        """``cairn.creds.<provider>.get`` → the connection's two slots (+ 0.7 aliases)."""
        provider = msg.subject.split(".")[2]
        body = await self._serve("creds.get", msg)
        if body is None:
            return
        if not is_uuid(body.get("account_id")):
            await self._reply(msg, {"error": "bad_request"})
            return
        acct = self.accounts.for_provider(body["account_id"], provider)
        if acct is None or acct.status == "revoked":
            await self._reply(msg, {"error": "account_gone"})
        elif acct.status == STATUS_NEEDS_REAUTH:
            await self._reply(msg, {"error": "needs_reauth"})
        else:
            await self._reply(msg, {"client_id": acct.client_id, "client_secret": acct.client_secret,
                                    "email": acct.client_id, "password": acct.client_secret})

    # ---- presign ---------------------------------------------------------------------------
    async def presign_upload(self, msg: Msg) -> None:
        provider = msg.subject.split(".", 3)[3]
        body = await self._serve("presign_upload", msg)
        if body is None:
            return
        try:
            if body.get("provider") and body["provider"] != provider:
                raise PresignError(f"provider {body['provider']!r} does not match the subject")
            user_id = str(body.get("user_id") or "")
            if user_id and not self.accounts.user_has_provider(user_id, provider):
                raise PresignError(f"user holds no {provider} account")
            key = self.blobs.mint_key(provider, str(body.get("kind") or ""), user_id,
                                      str(body.get("source_id") or ""))
            reply = self.blobs.presign_upload(key, str(body.get("content_type") or ""),
                                              str(body.get("content_sha256") or ""))
        except PresignError as exc:
            await self._error(msg, str(exc))
            return
        await self._reply(msg, reply)

    async def presign_download(self, msg: Msg) -> None:
        provider = msg.subject.split(".", 3)[3]
        body = await self._serve("presign_download", msg)
        if body is None:
            return
        blob_id = str(body.get("blob_id") or "")
        if not blob_id:
            await self._error(msg, "blob_id required")
        elif not key_provider_ok(blob_id, provider, results=True):
            await self._error(msg, f"blob_id outside the {provider} layout")
        else:
            await self._reply(msg, self.blobs.presign_download(blob_id))

    # ---- account lookup --------------------------------------------------------------------
    async def lookup(self, msg: Msg) -> None:
        """``cairn.accounts.lookup.<provider>.<worker_name>`` (webhook owner → account)."""
        parts = msg.subject.split(".")
        body = await self._serve("accounts.lookup", msg)
        if body is None:
            return
        if len(parts) != 5:
            await self._reply(msg, {"error": "bad_request"})
            return
        provider, pool = parts[3], parts[4]
        ext, sub = body.get("external_id"), body.get("subscription_id")
        if not ext and not sub:
            await self._reply(msg, {"error": "provider and external_id or subscription_id required"})
            return
        acct: Account | None = self.accounts.lookup(provider, pool, str(ext) if ext else None,
                                                    str(sub) if sub else None)
        if acct is None:
            await self._reply(msg, {"error": "not_found"})
            return
        if sub and acct.subscription_id != str(sub):
            acct.subscription_id = str(sub)  # core self-heals the mapping
        if not acct.auto_import:
            await self._reply(msg, {"error": "auto_import_suspended"})
            return
        await self._reply(msg, {"account_id": acct.account_id, "user_id": acct.user_id})

