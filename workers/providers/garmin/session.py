"""Garmin Connect through garth: a login per account, kept in memory, and every call under the budget."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import requests

from workers.logs import register_secret
from workers.providers.context import Login, ProviderContext
from workers.providers.errors import (
    ProviderAccountBlocked,
    ProviderAuthError,
    ProviderNotFound,
    ProviderPermanentError,
    ProviderRateLimited,
    ProviderTransientError,
)
from workers.providers.garmin.login_gate import LoginGate
from workers.providers.garmin.settings import GarminSettings
from workers.providers.windows import RateWindow, WindowUsage

with warnings.catch_warnings():  # garth 0.8 warns at import that it is no longer maintained (DESIGN)
    warnings.simplefilter("ignore", DeprecationWarning)
    from garth import sso
    from garth.exc import GarthException, GarthHTTPError
    from garth.http import Client

log = logging.getLogger(__name__)

T = TypeVar("T")

# Garmin publishes no limits and sends no usage headers. These are deliberately below what
# garminconnect users report being throttled at (a burst of ~100 calls, repeated logins within
# minutes), per connected account: a fetch_source is 3 calls, a login 4-5 requests.
SHORT_WINDOW = "short"
DAILY_WINDOW = "daily"
LOGIN_WINDOW = "login"
SHORT_LENGTH_S = 60.0  # the short window's capacity is CAIRN_GARMIN_REQUESTS_PER_MINUTE (settings.py)
DAILY_CAPACITY, DAILY_LENGTH_S = 1500, 86400.0
LOGIN_CAPACITY, LOGIN_LENGTH_S = 3, 900.0  # SSO logins per 15 min: the session cache makes one per day


def rate_windows(settings: GarminSettings) -> tuple[RateWindow, ...]:
    """The per-account windows every instance of the pool spends together (``cairn_rate_limits``)."""
    return (RateWindow(SHORT_WINDOW, settings.requests_per_minute, SHORT_LENGTH_S, snapshot_as="short"),
            RateWindow(DAILY_WINDOW, DAILY_CAPACITY, DAILY_LENGTH_S, snapshot_as="long"),
            RateWindow(LOGIN_WINDOW, LOGIN_CAPACITY, LOGIN_LENGTH_S))
API_BACKOFF_S = 300.0  # a Connect 429 without Retry-After: wait five minutes
LOGIN_BACKOFF_S = 3600.0  # an SSO 429 (Garmin blocks logins for about an hour)
DOWNLOAD_CHUNK_BYTES = 64 * 1024

INVALID_LOGIN_TYPES = frozenset({"INVALID_USERNAME_PASSWORD"})
MFA_TYPES = frozenset({"MFA_REQUIRED", "MFA_SETUP_REQUIRED"})


@dataclasses.dataclass
class _Session:
    fingerprint: str
    client: Client = dataclasses.field(repr=False)
    last_used: float
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class GarminSessions:
    """garth clients per account, in memory, and the calls made with them.

    Why garth: it is the SSO and Connect client ``garminconnect`` was built on; it speaks the
    mobile SSO flow (sign-in page for cookies, ``/mobile/api/login``, the service ticket traded
    for an OAuth1 token at ``preauthorized``, then an OAuth2 token at ``exchange/user/2.0``) and
    signs Connect calls with the OAuth2 bearer, refreshing it from the OAuth1 token when it
    expires. We configure it only through its documented knobs (``Client.configure``: domain,
    proxies, timeout, retries; ``Session.verify`` for the CA bundle) and call ``sso.login`` with
    ``return_on_mfa=True`` so a headless worker never prompts.

    * **Memory only, one per host.** One garth ``Client`` per Cairn account in an LRU of this
      process (``CAIRN_GARMIN_SESSION_CACHE_MAX``, idle TTL ``CAIRN_GARMIN_SESSION_IDLE_TTL_S``),
      tagged with the login's fingerprint: a re-connect with another password drops it and logs
      in again. The pool runs its jobs on threads (the Procfile's ``garmin`` line, ``-P
      threads``), so every job of a host shares this cache; a login is single-flight
      (``login_gate``). Nothing is written anywhere (``GARTH_HOME``/``GARTH_TOKEN`` stop the pool
      at start, settings.py); the tokens are registered with the log redactor when they exist.
    * **One call at a time per account and process** (``_Session.lock``): garth's client keeps
      per-call state (``last_resp``) and refreshes an expired OAuth2 token inside the call, so
      under the lock the refresh happens once per session, never once per concurrent job.
    * **No hidden retries.** garth's adapter retries 5xx three times; we set ``retries=0``, so
      every request is one reserved unit of budget and a 5xx or 429 becomes a NAK with delay.
    * **Login outcomes, classified from Garmin's answer** (``client.last_resp``): invalid
      password → ``ProviderAuthError`` (needs-reauth); MFA, locked, disabled →
      ``ProviderAccountBlocked``; 429 → ``ProviderRateLimited`` on the ``login`` window; 5xx
      and network errors → transient.
    * **A rejected session** (401 on a Connect call, or a failed OAuth2 refresh) is dropped and
      the job logs in once more with its fresh credentials; a second 401 is ``ProviderAuthError``.
    """

    def __init__(self, settings: GarminSettings, gate: LoginGate | None = None) -> None:
        self.settings = settings
        self.gate = gate or LoginGate(None)
        self.capacity = {w.name: w.capacity for w in rate_windows(settings)}
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._lock = threading.Lock()
        self.logins = 0  # SSO logins this process made (tests: the cache really saves them)

    # ------------------------------------------------------------------ clients

    def new_client(self) -> Client:
        """A garth client on a fresh requests session, configured for this pool."""
        client = Client(session=requests.Session())
        proxies = {"https": self.settings.proxy_url} if self.settings.proxy_url else None
        client.configure(domain=self.settings.domain, proxies=proxies, timeout=self.settings.timeout_s,
                         retries=0, status_forcelist=())
        if self.settings.ca_bundle:
            client.sess.verify = self.settings.ca_bundle  # requests: a path verifies with that bundle
        return client

    def forget(self, account_id: str, session: _Session | None = None) -> None:
        """Drop the account's session (only ``session``, when named: another thread may have made a new one)."""
        with self._lock:
            if session is None or self._sessions.get(account_id) is session:
                self._sessions.pop(account_id, None)

    def cached(self, account_id: str) -> bool:
        with self._lock:
            return account_id in self._sessions

    def _lookup(self, account_id: str, login: Login) -> _Session | None:
        """The account's live session for this login; a stale one (other password, idle too long) is dropped."""
        now = time.monotonic()
        with self._lock:
            session = self._sessions.get(account_id)
            if session is not None and (session.fingerprint != login.fingerprint
                                        or now - session.last_used > self.settings.session_idle_ttl_s):
                self._sessions.pop(account_id)
                session = None
            if session is not None:
                self._sessions.move_to_end(account_id)
                session.last_used = now
            return session

    def _session(self, ctx: ProviderContext) -> _Session:
        """The account's session, logging in only when no thread here has one (and behind the login gate)."""
        login = ctx.login
        if login is None or not login.username or not login.password:
            raise ProviderAuthError("the connection holds no Garmin login", code="needs_reauth")
        session = self._lookup(ctx.account_id, login)
        if session is not None:
            return session
        with self.gate.hold(ctx.account_id, lambda: self._lookup(ctx.account_id, login)) as made:
            if made is not None:  # another thread logged in while this one waited
                return made
            session = _Session(login.fingerprint, self._login(ctx, login), time.monotonic())
            with self._lock:
                self._sessions[ctx.account_id] = session
                while len(self._sessions) > self.settings.session_cache_max:
                    self._sessions.popitem(last=False)
            return session

    # ------------------------------------------------------------------ login

    def _login(self, ctx: ProviderContext, login: Login) -> Client:
        ctx.rate_limit.reserve((LOGIN_WINDOW,))
        client = self.new_client()
        self.logins += 1
        try:
            result = sso.login(login.username, login.password, client=client, return_on_mfa=True)
        except GarthException as exc:
            raise _login_failure(ctx, client, exc, self.capacity) from None
        except requests.RequestException as exc:
            raise ProviderTransientError(f"Garmin SSO unreachable: {type(exc).__name__}") from None
        if result[0] == "needs_mfa":
            raise ProviderAccountBlocked("the Garmin account requires multi-factor authentication, "
                                         "which a background import cannot answer", code="mfa_required")
        oauth1, oauth2 = result
        for secret in (oauth1.oauth_token, oauth1.oauth_token_secret, oauth1.mfa_token,
                       oauth2.access_token, oauth2.refresh_token):
            register_secret(secret)
        client.oauth1_token, client.oauth2_token = oauth1, oauth2  # what Client.login does, minus its dump
        log.info("garmin login for account %s", ctx.account_id)
        return client

    # ------------------------------------------------------------------ calls

    def connectapi(self, ctx: ProviderContext, path: str, params: Mapping[str, Any] | None = None) -> Any:
        """One Connect API JSON call (``connectapi.<domain><path>``); None for 204."""
        return self._call(ctx, path, lambda client: client.connectapi(path, params=dict(params or {}),
                                                                      headers=own_headers()))

    def download(self, ctx: ProviderContext, path: str) -> bytes:
        """A Connect download, bounded by ``max_download_bytes`` while it streams."""
        limit = self.settings.max_download_bytes

        def fetch(client: Client) -> bytes:
            response = client.get("connectapi", path, api=True, stream=True, headers=own_headers())
            body = bytearray()
            try:
                for chunk in response.iter_content(DOWNLOAD_CHUNK_BYTES):
                    body += chunk
                    if len(body) > limit:
                        raise ProviderPermanentError(f"download {path} exceeds {limit} bytes", code="too_large")
            finally:
                response.close()
            return bytes(body)

        return self._call(ctx, path, fetch)

    def _call(self, ctx: ProviderContext, path: str, call: Callable[[Client], T]) -> T:
        for attempt in (1, 2):
            session = self._session(ctx)
            ctx.rate_limit.reserve((DAILY_WINDOW, ctx.bucket or SHORT_WINDOW))
            try:
                with session.lock:
                    return call(session.client)
            except GarthHTTPError as exc:
                status = _status(exc)
                if status == 401 and attempt == 1:  # token rejected or refresh refused: log in again once
                    self.forget(ctx.account_id, session)
                    continue
                raise _api_failure(ctx, path, status, exc, self.capacity) from None
            except requests.RequestException as exc:
                raise ProviderTransientError(f"Garmin {path}: {type(exc).__name__}") from None
            except GarthException as exc:  # garth's own refusals (a refresh without a token)
                self.forget(ctx.account_id, session)
                raise ProviderTransientError(f"Garmin {path}: {type(exc).__name__}") from None
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def own_headers() -> dict[str, str]:
    """A fresh headers dict for one Connect call.

    garth's ``Client.request`` has a mutable default ``headers={}`` and writes the bearer into it
    (``headers["Authorization"] = ...``): every call that omits ``headers`` shares that one dict
    in the process. On the Garmin pool's threads two accounts' calls would race on it and one
    could go out with the other's bearer, so every call passes its own.
    """
    return {}


def _status(exc: GarthHTTPError) -> int:
    response = getattr(exc.error, "response", None)
    return int(response.status_code) if response is not None else 0


def _retry_after(headers: Mapping[str, str], default_s: float) -> datetime:
    now = datetime.now(UTC)
    value = str(headers.get("Retry-After") or headers.get("retry-after") or "").strip()
    if value.isdigit():
        return now + timedelta(seconds=int(value))
    if value:
        try:
            return parsedate_to_datetime(value).astimezone(UTC)
        except (TypeError, ValueError):
            pass
    return now + timedelta(seconds=default_s)


def rate_limited(ctx: ProviderContext, window: str, headers: Mapping[str, str],
                 default_s: float, capacity: Mapping[str, int]) -> ProviderRateLimited:
    """Garmin said 429: mark ``window`` spent until the reset for every instance, and say so."""
    reset_at = _retry_after(headers, default_s)
    spent = capacity[window]
    ctx.rate_limit.observe([WindowUsage(window, spent, spent, reset_at)], dict(headers))
    return ProviderRateLimited(reset_at, window)


def _api_failure(ctx: ProviderContext, path: str, status: int, exc: GarthHTTPError,
                 capacity: Mapping[str, int]) -> Exception:
    response = getattr(exc.error, "response", None)
    headers: Mapping[str, str] = response.headers if response is not None else {}  # case-insensitive
    if status == 401:
        return ProviderAuthError(f"Garmin refused the session twice ({path})", code="needs_reauth")
    if status == 404:
        return ProviderNotFound(f"Garmin {path}: 404")
    if status == 429:
        return rate_limited(ctx, ctx.bucket or SHORT_WINDOW, headers, API_BACKOFF_S, capacity)
    if status >= 500 or status in (0, 408):
        return ProviderTransientError(f"Garmin {path}: HTTP {status}")
    return ProviderPermanentError(f"Garmin {path}: HTTP {status}", code=f"http_{status}")


def _login_failure(ctx: ProviderContext, client: Client, exc: GarthException,
                   capacity: Mapping[str, int]) -> Exception:
    """Classify a failed SSO login from Garmin's own answer (``client.last_resp``)."""
    response = getattr(client, "last_resp", None)
    status = int(response.status_code) if response is not None else 0
    body: dict[str, Any] = {}
    if response is not None:
        try:
            parsed = response.json()
            body = parsed if isinstance(parsed, dict) else {}
        except ValueError:
            body = {}
    kind = str((body.get("responseStatus") or {}).get("type") or "")
    error_status = str((body.get("error") or {}).get("status-code") or "")
    if status == 429 or error_status == "429":
        return rate_limited(ctx, LOGIN_WINDOW, response.headers if response is not None else {}, LOGIN_BACKOFF_S,
                            capacity)
    if kind in INVALID_LOGIN_TYPES:
        return ProviderAuthError("Garmin refused the login: invalid username or password", code="needs_reauth")
    if kind in MFA_TYPES:
        return ProviderAccountBlocked("the Garmin account requires multi-factor authentication",
                                      code="mfa_required")
    if "LOCKED" in kind:
        return ProviderAccountBlocked("the Garmin account is locked (reset the password at Garmin)",
                                      code="account_locked")
    if "DISABLED" in kind:
        return ProviderAccountBlocked("the Garmin account is disabled", code="account_disabled")
    if status >= 500:
        return ProviderTransientError(f"Garmin SSO: HTTP {status}")
    return ProviderTransientError(f"Garmin SSO login failed: {kind or status or type(exc).__name__}")
