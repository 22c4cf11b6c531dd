"""In-memory external accounts (connections) of the dev core.

Core keeps tokens encrypted in Postgres; the double keeps them in memory only,
which is all the token, creds and lookup responders need. One record is one
connection: a provider account connected to one pool (``worker_name``), with
its own tokens, app credentials and sync state (contract §3).
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

APP_ID_HEX_CHARS = 16  # app_id = first 16 hex chars of sha256(client_id)
DEFAULT_SCOPE = "read,activity:read_all"
STATUS_ACTIVE = "active"
STATUS_NEEDS_REAUTH = "needs_reauth"
STATUS_REVOKED = "revoked"


def app_id_for(client_id: str) -> str:
    """A stable, non-secret id of the provider app a connection uses (contract §3 budgets)."""
    return hashlib.sha256(client_id.encode()).hexdigest()[:APP_ID_HEX_CHARS]


def is_uuid(value: object) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return isinstance(value, str)


@dataclass
class Account:
    """One connection: provider account × pool, with its token state."""

    provider: str
    account_id: str
    user_id: str
    access_token: str | None
    refresh_token: str | None
    expires_at: datetime | None
    worker_name: str | None = None  # the pool; None matches any pool (legacy connection)
    external_id: str | None = None  # the provider's owner id (Strava athlete id)
    subscription_id: str | None = None
    client_id: str = ""
    client_secret: str = ""
    scope: str = DEFAULT_SCOPE
    status: str = STATUS_ACTIVE
    auto_import: bool = True
    sync_watermark: datetime | None = None
    last_sync_at: datetime | None = None
    last_metrics_at: datetime | None = None
    needs_reauth_reason: str | None = None

    @property
    def app_id(self) -> str | None:
        return app_id_for(self.client_id) if self.client_id else None

    def __repr__(self) -> str:  # never show tokens or the client secret
        return (f"Account(provider={self.provider!r}, account_id={self.account_id!r}, "
                f"worker_name={self.worker_name!r}, status={self.status!r})")


class AccountRegistry:
    """Thread-safe account table shared by the responders (loop thread) and the test thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[str, Account] = {}

    def add(self, account: Account) -> Account:
        with self._lock:
            self._by_id[account.account_id] = account
        return account

    def get(self, account_id: str) -> Account | None:
        with self._lock:
            return self._by_id.get(account_id)

    def for_provider(self, account_id: object, provider: str) -> Account | None:
        """The account, only if it belongs to ``provider`` (0.7: subject-scoped)."""
        acct = self.get(str(account_id)) if is_uuid(account_id) else None
        return acct if acct is not None and acct.provider == provider else None

    def all(self) -> list[Account]:
        with self._lock:
            return list(self._by_id.values())

    def user_has_provider(self, user_id: str, provider: str) -> bool:
        return any(a.user_id == user_id and a.provider == provider for a in self.all())

    def lookup(self, provider: str, worker_name: str, external_id: str | None,
               subscription_id: str | None) -> Account | None:
        """Webhook owner → connection of the pool in the subject (a pool-less one matches any)."""
        candidates = [a for a in self.all() if a.provider == provider
                      and a.worker_name in (worker_name, None)]
        if subscription_id:
            hit = [a for a in candidates if a.subscription_id == subscription_id]
            if hit:
                return sorted(hit, key=lambda a: a.worker_name is None)[0]
        hit = [a for a in candidates if external_id and a.external_id == str(external_id)]
        return sorted(hit, key=lambda a: a.worker_name is None)[0] if hit else None


def utcnow() -> datetime:
    return datetime.now(UTC)
