"""The fake Strava's OAuth state: registered apps, authorization codes, access and refresh tokens.

Strava's token rules are what the provider pool's token handling is tested
against (reference ``cairn.md`` §4), so they live here in one place, apart from
the HTTP routes (``devstack.fakes.strava.api``):

* access tokens live six hours; a refresh while the current token still has more
  than an hour left returns that same token pair;
* a refresh otherwise issues a new access token and, by default, a new refresh
  token that retires the old one (``rotate_refresh_tokens=False`` keeps the old
  refresh token, as Strava did for years);
* an authorization code works once, and only for the app it was issued to;
* deauthorizing an athlete kills every one of its tokens.

HTTP-agnostic: ``exchange`` returns the status and JSON body for the route to
send. Not thread-safe by itself: ``FakeStrava`` holds its lock around every call.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from devstack.fakes.strava.data import FakeAthlete

ACCESS_TOKEN_TTL_S = 6 * 3600  # Strava access tokens live six hours
REFRESH_REISSUE_WINDOW_S = 3600  # a refresh returns the current token while it has more than 1 h left
TOKEN_BYTES = 20  # Strava tokens and codes are 40 hex characters
DEFAULT_CLIENT_ID = "12345"
DEFAULT_SCOPE = "read,activity:read_all"


@dataclass
class Token:
    """Whom a token (access or refresh) belongs to, and when the access token it came with expires."""

    athlete_id: int
    client_id: str
    expires_at: int


@dataclass(frozen=True)
class Grant:
    """What the token endpoint answers: status, the token it stands for (``None`` on refusal), JSON body.

    ``render`` builds the body and the route calls it after logging the request,
    so a refresh's ``expires_in`` is read off the clock as the answer goes out
    (a code grant's body is built when its tokens are issued).
    """

    status: int
    token: Token | None
    render: Callable[[], dict[str, Any]]


def _invalid(status: int, resource: str, fld: str) -> Grant:
    """Strava's token-endpoint refusal, naming what it did not accept."""
    body = {"message": "Bad Request", "errors": [{"resource": resource, "field": fld, "code": "invalid"}]}
    return Grant(status, None, lambda: body)


class OAuthState:
    """Apps, one-use codes and the token tables, with Strava's issue / refresh / revoke rules.

    ``clock`` is read wherever Strava would look at the time (issue, expiry,
    refresh window), so a settable test clock drives expiry without waiting.
    """

    def __init__(self, clock: Callable[[], float], rotate_refresh_tokens: bool) -> None:
        self._clock = clock
        self.rotate_refresh_tokens = rotate_refresh_tokens
        self._apps: dict[str, str] = {}
        self._tokens: dict[str, Token] = {}
        self._refresh: dict[str, Token] = {}
        self._codes: dict[str, tuple[int, str, str]] = {}

    def add_app(self, client_id: str, client_secret: str) -> None:
        self._apps[client_id] = client_secret

    def valid_app(self, client_id: str, client_secret: str) -> bool:
        """Whether the pair names a registered application (push subscriptions check it)."""
        known = self._apps.get(client_id)
        return known is not None and secrets.compare_digest(known.encode(), client_secret.encode())

    def issue_tokens(self, ath: FakeAthlete) -> None:
        """Give ``ath`` a fresh token pair for its current app (old tokens stay valid until revoked)."""
        ath.access_token, ath.refresh_token = secrets.token_hex(TOKEN_BYTES), secrets.token_hex(TOKEN_BYTES)
        ath.expires_at = int(self._clock()) + ACCESS_TOKEN_TTL_S
        self._tokens[ath.access_token] = Token(ath.athlete_id, ath.client_id, ath.expires_at)
        self._refresh[ath.refresh_token] = Token(ath.athlete_id, ath.client_id, ath.expires_at)

    def issue_code(self, athlete_id: int, client_id: str, scope: str) -> str:
        """A one-use authorization code, as the authorize redirect would deliver it."""
        code = secrets.token_hex(TOKEN_BYTES)
        self._codes[code] = (athlete_id, client_id, scope)
        return code

    def expire(self, ath: FakeAthlete) -> None:
        """Make the athlete's current access token expired a second ago."""
        ath.expires_at = int(self._clock()) - 1
        self._tokens[ath.access_token].expires_at = ath.expires_at

    def revoke(self, athlete_id: int) -> None:
        """Deauthorize: drop every access and refresh token of the athlete."""
        for table in (self._tokens, self._refresh):
            for tok in [k for k, v in table.items() if v.athlete_id == athlete_id]:
                del table[tok]

    def authenticate(self, authorization: str, athletes: Mapping[int, FakeAthlete]) -> Token | None:
        """The live token behind an ``Authorization: Bearer …`` header, or ``None`` (Strava's 401)."""
        token = self._tokens.get(authorization[7:]) if authorization[:7].lower() == "bearer " else None
        if token is None or token.expires_at <= self._clock() or token.athlete_id not in athletes:
            return None
        return token

    def exchange(self, form: Mapping[str, str], athletes: Mapping[int, FakeAthlete]) -> Grant:
        """``POST /oauth/token``: check the app, then the code or refresh-token grant."""
        client_id = form.get("client_id", "")
        if self._apps.get(client_id) is None or self._apps[client_id] != form.get("client_secret"):
            return _invalid(401, "Application", "client_id")
        grant = form.get("grant_type")
        if grant == "authorization_code":
            entry = self._codes.pop(form.get("code", ""), None)
            if entry is None or entry[1] != client_id or entry[0] not in athletes:
                return _invalid(400, "AuthorizationCode", "code")
            ath = athletes[entry[0]]
            ath.client_id = client_id
            self.issue_tokens(ath)
            body = self._token_body(ath) | {"athlete": {
                "id": ath.athlete_id, "username": f"athlete{ath.athlete_id}", "resource_state": 2,
                "firstname": "Test", "lastname": f"Athlete {ath.athlete_id}"}}
            return Grant(200, self._tokens[ath.access_token], lambda: body)
        if grant == "refresh_token":
            old = self._refresh.get(form.get("refresh_token", ""))
            if old is None or old.client_id != client_id or old.athlete_id not in athletes:
                return _invalid(400, "RefreshToken", "refresh_token")
            ath = athletes[old.athlete_id]
            if ath.expires_at - self._clock() <= REFRESH_REISSUE_WINDOW_S:
                previous_refresh = ath.refresh_token
                self.issue_tokens(ath)
                if not self.rotate_refresh_tokens:
                    del self._refresh[ath.refresh_token]
                    ath.refresh_token = previous_refresh
                elif previous_refresh != ath.refresh_token:
                    self._refresh.pop(previous_refresh, None)
            return Grant(200, self._tokens[ath.access_token], lambda: self._token_body(ath))
        return _invalid(400, "Application", "grant_type")

    def _token_body(self, ath: FakeAthlete) -> dict[str, Any]:
        return {"token_type": "Bearer", "access_token": ath.access_token, "expires_at": ath.expires_at,
                "expires_in": max(int(ath.expires_at - self._clock()), 0), "refresh_token": ath.refresh_token}
