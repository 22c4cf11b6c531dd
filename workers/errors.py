"""The small exception tree every Switchyard component raises from."""

from __future__ import annotations


class SwitchyardError(Exception):
    """Root of every error Switchyard raises on purpose.

    Task functions map a failure to the contract's outcome (Voicy ``retryable``, Cairn
    disposition) by class, never by parsing messages. A message never carries a secret:
    build it from redacted values only.
    """


class ConfigError(SwitchyardError):
    """A missing or invalid setting. Raised at process start; names the variable."""


class AuthError(SwitchyardError):
    """The counterpart rejected our credentials (HTTP 401, NATS authorization)."""


class JobError(SwitchyardError):
    """A job could not be completed. Subclasses say whether a retry can help."""

    retryable: bool = True


class RetryableJobError(JobError):
    """Transient: network, 5xx, timeouts. The external system should requeue."""

    retryable = True


class PermanentJobError(JobError):
    """Deterministic: undecodable media, invalid payload. Retrying cannot help."""

    retryable = False


class StaleJobError(SwitchyardError):
    """The job is no longer ours (another owner, cancelled, finished). Drop it quietly."""
