"""The fake Garmin's shared state and its sign-in side: SSO, the OAuth consumer, OAuth1 → OAuth2.

It answers what garth 0.8 sends (read from its ``sso.py``; shapes from its
recorded cassettes of the real service):

* ``GET sso.<d>/mobile/sso/en/sign-in?clientId=GCM_ANDROID_DARK`` sets the SSO
  cookie the login POST then requires;
* ``POST sso.<d>/mobile/api/login`` (JSON username/password) answers
  ``SUCCESSFUL`` + ``serviceTicketId``; a wrong login is HTTP 401 with
  ``responseStatus.type`` ``INVALID_USERNAME_PASSWORD`` (as recorded); an account
  with two-step verification ``MFA_REQUIRED`` (HTTP 200, as recorded); a locked
  account HTTP 401 ``ACCOUNT_LOCKED`` (the real message key is
  ``generalLoginMobileAccountLocked``; the status code is our assumption);
* ``GET sso.<d>/portal/sso/embed`` (best effort in garth);
* ``GET thegarth.s3.amazonaws.com/oauth_consumer.json``, the consumer key pair;
* ``GET connectapi.<d>/oauth-service/oauth/preauthorized?ticket=…`` signed
  OAuth1 (HMAC-SHA1, consumer only; the signature is verified) → a one-use
  ticket becomes ``oauth_token=…&oauth_token_secret=…``;
* ``POST connectapi.<d>/oauth-service/oauth/exchange/user/2.0`` signed with
  the OAuth1 token → the OAuth2 bearer JSON (``expires_in`` and
  ``refresh_token_expires_in``, which garth turns into absolute times).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import threading
from collections import Counter
from typing import Any
from urllib.parse import parse_qsl, urlencode

from oauthlib.common import Request as OAuthRequest
from oauthlib.oauth1.rfc5849 import signature, utils
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from devstack.fakes.garmin.data import FakeAccount

CLIENT_ID = "GCM_ANDROID_DARK"
SSO_COOKIE = "GARMIN-SSO-CUST-GUID"
ACCESS_TOKEN_TTL_S = 3600
REFRESH_TOKEN_TTL_S = 30 * 86400
TOKEN_BYTES = 24
# Fixed, as the real pair garth downloads is: garth caches the consumer in a module global for the
# life of the process, so every fake in one process must hand out the same one.
CONSUMER_KEY = "fake-garmin-consumer-key"
CONSUMER_SECRET = "fake-garmin-consumer-secret"
ENDPOINTS = ("sign_in", "login", "embed", "consumer", "preauthorized", "exchange",
             "list", "activity", "gear", "download")


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    """What the fake saw: endpoint, path and status (never a body, header or query: secrets)."""

    endpoint: str
    path: str
    status: int
    email: str = ""


@dataclasses.dataclass
class Fault:
    status: int
    times: int
    headers: dict[str, str]
    body: dict[str, Any] | None = None


class GarminState:
    """Accounts, issued tickets and tokens, injected faults and the request log; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.accounts: dict[str, FakeAccount] = {}
        self.consumer_key, self.consumer_secret = CONSUMER_KEY, CONSUMER_SECRET
        self.tickets: dict[str, str] = {}  # one-use service ticket → email
        self.oauth1: dict[str, tuple[str, str]] = {}  # oauth_token → (secret, email)
        self.bearers: dict[str, str] = {}  # OAuth2 access token → email
        self.faults: dict[str, list[Fault]] = {}
        self.requests: list[RequestRecord] = []
        self.logins: Counter[str] = Counter()  # successful and refused login POSTs per email

    def record(self, endpoint: str, request: Request, status: int, email: str = "") -> None:
        with self.lock:
            self.requests.append(RequestRecord(endpoint, request.url.path, status, email))

    def fault(self, endpoint: str, request: Request) -> Response | None:
        with self.lock:
            queue = self.faults.get(endpoint) or []
            if not queue:
                return None
            fault = queue[0]
            fault.times -= 1
            if fault.times <= 0:
                queue.pop(0)
        self.record(endpoint, request, fault.status)
        return JSONResponse(fault.body or {"message": "injected fault"}, fault.status, headers=fault.headers)

    def issue_oauth1(self, email: str) -> tuple[str, str]:
        token, secret = secrets.token_hex(16), secrets.token_urlsafe(TOKEN_BYTES)
        with self.lock:
            self.oauth1[token] = (secret, email)
        return token, secret

    def issue_bearer(self, email: str) -> dict[str, Any]:
        access = secrets.token_urlsafe(TOKEN_BYTES)
        with self.lock:
            self.bearers[access] = email
        return {"scope": "CONNECT_READ CONNECT_WRITE", "jti": secrets.token_hex(8), "token_type": "Bearer",
                "access_token": access, "refresh_token": secrets.token_urlsafe(TOKEN_BYTES),
                "expires_in": ACCESS_TOKEN_TTL_S, "refresh_token_expires_in": REFRESH_TOKEN_TTL_S}

    def revoke(self, email: str) -> None:
        """Every session of ``email`` stops working (a password change at Garmin)."""
        with self.lock:
            self.bearers = {k: v for k, v in self.bearers.items() if v != email}
            self.oauth1 = {k: v for k, v in self.oauth1.items() if v[1] != email}


def _status(kind: str, message: str, http: str) -> dict[str, Any]:
    return {"serviceURL": None, "serviceTicketId": None,
            "responseStatus": {"type": kind, "message": message, "httpStatus": http},
            "responseReason": None, "customerMfaInfo": None, "consentTypeList": None,
            "captchaAlreadyPassed": False, "samlResponse": None, "authType": None}


class SsoRoutes:
    """Starlette handlers of sso.<domain>, the consumer host and connectapi's OAuth endpoints."""

    def __init__(self, state: GarminState) -> None:
        self.state = state

    async def sign_in(self, request: Request) -> Response:
        if (fault := self.state.fault("sign_in", request)) is not None:
            return fault
        self.state.record("sign_in", request, 200)
        response = HTMLResponse("<html><head><title>Garmin SSO Portal</title></head></html>")
        response.set_cookie(SSO_COOKIE, secrets.token_hex(8), secure=True, httponly=True)
        return response

    async def embed(self, request: Request) -> Response:
        self.state.record("embed", request, 200)
        return HTMLResponse("<html><title>GARMIN Authentication Application</title></html>")

    async def login(self, request: Request) -> Response:
        if (fault := self.state.fault("login", request)) is not None:
            return fault
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = {}
        email, password = str(body.get("username") or ""), str(body.get("password") or "")
        if request.query_params.get("clientId") != CLIENT_ID or SSO_COOKIE not in request.cookies:
            self.state.record("login", request, 403, email)
            return JSONResponse(_status("FORBIDDEN", "missing sign-in cookie or client id", "FORBIDDEN"), 403)
        with self.state.lock:
            account = self.state.accounts.get(email)
            self.state.logins[email] += 1
        if account is None or not secrets.compare_digest(account.password.encode(), password.encode()):
            self.state.record("login", request, 401, email)
            return JSONResponse(_status("INVALID_USERNAME_PASSWORD", "generalLoginInvalidUsernameOrPassword",
                                        "UNAUTHORIZED"), 401)
        if account.locked:
            self.state.record("login", request, 401, email)
            return JSONResponse(_status("ACCOUNT_LOCKED", "generalLoginMobileAccountLocked", "UNAUTHORIZED"), 401)
        if account.mfa:
            self.state.record("login", request, 200, email)
            reply = _status("MFA_REQUIRED", "", "OK")
            reply["customerMfaInfo"] = {"email": "fa*****@example.com", "mfaLastMethodUsed": "email"}
            return JSONResponse(reply)
        ticket = f"ST-{secrets.randbelow(10**6):06d}-{secrets.token_urlsafe(15)}-sso"
        with self.state.lock:
            self.state.tickets[ticket] = email
        self.state.record("login", request, 200, email)
        reply = _status("SUCCESSFUL", "", "OK")
        reply.update(serviceURL=request.query_params.get("service"), serviceTicketId=ticket, authType="CAS")
        return JSONResponse(reply)

    async def consumer(self, request: Request) -> Response:
        self.state.record("consumer", request, 200)
        return JSONResponse({"consumer_key": self.state.consumer_key,
                             "consumer_secret": self.state.consumer_secret})

    def _signed(self, request: Request, form: list[tuple[str, str]]) -> dict[str, str] | None:
        """The OAuth1 parameters of a correctly signed request (HMAC-SHA1), else None."""
        header = request.headers.get("authorization", "")
        if not header.startswith("OAuth "):
            return None
        params = {k: utils.unescape(v) for k, v in utils.parse_authorization_header(header)}
        if params.get("oauth_consumer_key") != self.state.consumer_key:
            return None
        token_secret = None
        if "oauth_token" in params:
            with self.state.lock:
                issued = self.state.oauth1.get(params["oauth_token"])
            if issued is None:
                return None
            token_secret = issued[0]
        query = request.url.query
        uri = f"https://{request.headers.get('host', '')}{request.url.path}" + (f"?{query}" if query else "")
        signed = OAuthRequest(uri, http_method=request.method)
        signed.params = signature.collect_parameters(uri_query=query, body=form,
                                                     headers={"Authorization": header})
        signed.signature = params.get("oauth_signature", "")
        return params if signature.verify_hmac_sha1(signed, self.state.consumer_secret, token_secret) else None

    async def preauthorized(self, request: Request) -> Response:
        if (fault := self.state.fault("preauthorized", request)) is not None:
            return fault
        if self._signed(request, []) is None:
            self.state.record("preauthorized", request, 401)
            return PlainTextResponse("invalid signature", 401)
        with self.state.lock:
            email = self.state.tickets.pop(request.query_params.get("ticket", ""), "")
        if not email:
            self.state.record("preauthorized", request, 401)
            return PlainTextResponse("ticket not recognized", 401)
        token, secret = self.state.issue_oauth1(email)
        self.state.record("preauthorized", request, 200, email)
        return PlainTextResponse(urlencode({"oauth_token": token, "oauth_token_secret": secret}))

    async def exchange(self, request: Request) -> Response:
        if (fault := self.state.fault("exchange", request)) is not None:
            return fault
        form = parse_qsl((await request.body()).decode("utf-8", "replace"))
        params = self._signed(request, form)
        if params is None or "oauth_token" not in params:
            self.state.record("exchange", request, 401)
            return JSONResponse({"message": "invalid signature or token"}, 401)
        with self.state.lock:
            email = self.state.oauth1[params["oauth_token"]][1]
        self.state.record("exchange", request, 200, email)
        return JSONResponse(self.state.issue_bearer(email))
