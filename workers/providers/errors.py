"""Provider errors: how a provider says why a call failed, without knowing the contract's acks."""

from __future__ import annotations

from datetime import UTC, datetime

from workers.errors import AuthError, PermanentJobError, RetryableJobError


class ProviderError(Exception):
    """Mixin carrying the contract's failure ``code`` and worker ``ErrorClass`` name.

    Classes, not messages, and no NATS: ``workers/cairn/handlers/failure.py`` maps rate limited
    → NAK anchored to the window, not found / permanent / account blocked → envelope + Term,
    auth → needs-reauth, transient → NAK. Messages never carry tokens or client secrets.
    """

    code: str = "provider_error"
    error_class: str = "ERROR_CLASS_TRANSIENT"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code:
            self.code = code


class ProviderTransientError(ProviderError, RetryableJobError):
    """Network failure, timeout, 5xx: NAK and let JetStream redeliver."""

    code = "transient"
    error_class = "ERROR_CLASS_TRANSIENT"


class ProviderPermanentError(ProviderError, PermanentJobError):
    """Unmappable data or a request the provider will always refuse: envelope + Term."""

    code = "invalid_input"
    error_class = "ERROR_CLASS_INVALID_INPUT"


class ProviderNotFound(ProviderError, PermanentJobError):
    """The entity is gone upstream (deleted activity): envelope ``not_found``."""

    code = "not_found"
    error_class = "ERROR_CLASS_NOT_FOUND"


class ProviderAuthError(ProviderError, PermanentJobError, AuthError):
    """The provider rejected the token or app credentials; the user must re-connect."""

    code = "needs_reauth"
    error_class = "ERROR_CLASS_AUTH_EXPIRED"


class ProviderAccountBlocked(ProviderError, PermanentJobError):
    """The login is right but the provider will not let this worker in: the account needs
    multi-factor authentication, or is locked or disabled. Only the user can change that, and
    a re-connect with the same login would not help, so it is not needs-reauth: envelope + Term
    with the reason as ``code`` (``mfa_required``, ``account_locked``)."""

    code = "account_blocked"
    error_class = "ERROR_CLASS_AUTH_INVALID"


class UnsupportedDataset(ProviderTransientError):
    """A raw archive of another dataset version than this parser reads (contract §1): NAK, so a
    pool that reads it (an older or newer release) takes the parse_blob job."""

    code = "unsupported_dataset"


def archive_dataset(version: object, readable: int) -> int:
    """The dataset ``N`` of an archive's ``version`` (``N`` or ``"N.M"``); ``UnsupportedDataset``
    unless it is ``readable``, the one this parser reads."""
    try:
        dataset = int(str(version).split(".", 1)[0])
    except ValueError:
        raise UnsupportedDataset(f"archive dataset {version!r} unreadable") from None
    if dataset != readable:
        raise UnsupportedDataset(f"archive dataset {dataset}, this parser reads {readable}")
    return dataset


class ProviderRateLimited(ProviderError, RetryableJobError):
    """The provider's (or our shared) budget is spent until ``reset_at``.

    ``reset_at`` is the real window boundary (not "now + a guess"), so the NAK
    delay and the shared limiter both wake up when the provider does.
    ``window`` names the exhausted window (one of the provider's
    ``rate_windows()``, e.g. Strava's ``short``, ``daily``, ``webhook``).
    """

    code = "rate_limited"
    error_class = "ERROR_CLASS_RATE_LIMITED"

    def __init__(self, reset_at: datetime, window: str, *, grace_s: float = 0.0,
                 message: str | None = None) -> None:
        self.reset_at = reset_at.astimezone(UTC)
        self.window = window
        self.grace_s = grace_s
        super().__init__(message or f"rate limited: {window} window resets at "
                         f"{self.reset_at.isoformat().replace('+00:00', 'Z')}")

    def delay_s(self, now: datetime | None = None) -> float:
        """Seconds until the window resets, plus grace; never negative. The NAK that waits for it
        is the Cairn side's: it never goes out below its floor (``disposition.MIN_NAK_DELAY_S``)."""
        now = now or datetime.now(UTC)
        return max(0.0, (self.reset_at - now).total_seconds() + self.grace_s)
