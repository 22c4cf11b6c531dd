"""Cairn-side settings (``CAIRN_*``), with the Strava worker's variable names."""

from __future__ import annotations

import os
import re
import socket
import uuid

from pydantic import AliasChoices, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from workers.config import load_settings
from workers.logs import register_secret
from workers.redisconn import redis_settings

# The release vX.Y.Z: the core contract we implement (major.minor follow core; checked against the
# ``cairn_core`` KV ``info`` before the pool runs), sent as presence ``release``. Not the dataset N
# (raw blob format) nor the parser version N.M, which only the provider knows (``Provider.parser_version``).
# The patch level is ours: it is this Switchyard release (pyproject's version, CHANGELOG.md).
WORKER_RELEASE = "v0.7.1"
WORKER_VERSION = WORKER_RELEASE  # the release string, not the parser version
RELEASE_PATTERN = r"^v\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$"  # vX.Y.Z[-pre][+build]
# A dev build: ``dev`` itself or anything starting with it (``dev-abc123``, ``dev.3``, ``dev+g1``), or a
# release whose pre-release or build part has an identifier starting with ``dev`` (``v0.8.0-dev.3``,
# ``v0.8.0+dev``, ``v0.8.0-rc.1+dev.2``). Core may omit the ``v`` and the patch (``0.8-dev``).
DEV_BUILD_PATTERN = (r"^(?:dev[0-9A-Za-z.+-]*"
                     r"|v?\d+\.\d+(?:\.\d+)?[-+](?:[0-9A-Za-z]+[.+-])*dev[0-9A-Za-z.+-]*)$")
_DEV_BUILD_RE = re.compile(DEV_BUILD_PATTERN, re.IGNORECASE)
DEFAULT_MAX_IN_FLIGHT = 16
# The build identity every result carries when CAIRN_WORKER_PACKAGE is unset: derived from the
# provider, so each pool of a several-pool app stamps its own (an app-wide value would stamp them all).
DEFAULT_WORKER_PACKAGE_PREFIX = "switchyard.providers."
DEFAULT_ACK_WAIT_S = 30.0
# Consumer MaxDeliver: unlimited, as the real Strava worker's (reference §3.3). Rate-limit waits and
# parser refusals are NAKed without counting towards our own term, so a finite MaxDeliver would let
# JetStream stop delivering such a job silently, without the failure envelope C2 demands.
UNLIMITED_MAX_DELIVER = -1
DEFAULT_MAX_DELIVER = UNLIMITED_MAX_DELIVER
TERM_AFTER_DELIVERIES = 5  # a job that failed this many times minus one is termed on its next delivery
DEFAULT_LEASE_TTL_S = 15.0  # a SIGKILLed provider task is noticed by the bridge about this long after
DEFAULT_SHUTDOWN_GRACE_S = 20.0  # SIGTERM: the bridge's running tasks get this long before their NAK
DEFAULT_TASK_START_DEADLINE_S = 60.0  # a dispatched task not started by then is revoked and NAKed
DEFAULT_PRESENCE_INTERVAL_S = 20.0  # contract §2: every ~20 s
MAX_PRESENCE_INTERVAL_S = 30.0  # core counts a record live for 45 s: leave room for one late write
DEFAULT_DISCOVER_DEADLINE_S = 30.0
DEFAULT_EXCHANGE_DEADLINE_S = 15.0
MAX_EXCHANGE_DEADLINE_S = 20.0  # contract §9b: core waits 20 s for the exchange reply
NAME_PATTERN = r"^[a-z0-9_-]{1,48}$"
# A pool's own credentials, for a fleet whose pools share one environment (an app's config vars):
# ``CAIRN_POOL_<WORKER_NAME>_<FIELD>`` (the name upper-cased, ``-`` as ``_``) wins over ``CAIRN_<FIELD>``.
# Under core's auth callout an enrollment is one pool's, so every pool needs its own.
POOL_VARIABLE_PREFIX = "CAIRN_POOL_"
POOL_CREDENTIALS = ("worker_enrollment_token", "nats_creds", "nats_user", "nats_password")
SECRET_CREDENTIALS = frozenset({"worker_enrollment_token", "nats_password"})


def pool_variable(worker_name: str, field: str) -> str:
    """``CAIRN_POOL_<WORKER_NAME>_<FIELD>``: the pool's own value of a credential (``POOL_CREDENTIALS``)."""
    return f"{POOL_VARIABLE_PREFIX}{worker_name.upper().replace('-', '_')}_{field.upper()}"


def is_dev_build(release: str) -> bool:
    """Whether ``release`` (ours or core's) is a dev build, exempt from the compatibility check.

    The one rule: ``CAIRN_RELEASE`` is validated with it and the bridge applies it to both
    sides, so a release accepted here is never refused, or blamed on the wrong side, later.
    """
    return bool(_DEV_BUILD_RE.match(release.strip()))


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class CairnTimings(BaseSettings):
    """The Cairn periods (the presence interval, which the provider worker checks at its start):
    read alone, so a bad ``CAIRN_*`` elsewhere stops only the Cairn side's own processes."""

    model_config = SettingsConfigDict(env_prefix="CAIRN_", extra="ignore", env_ignore_empty=True)

    presence_interval_s: float = Field(default=DEFAULT_PRESENCE_INTERVAL_S, gt=0, le=MAX_PRESENCE_INTERVAL_S)


class CairnSettings(CairnTimings):
    """Everything the Cairn side reads from the environment (``CAIRN_*``), bridge and tasks alike."""

    model_config = SettingsConfigDict(env_prefix="CAIRN_", extra="ignore", env_ignore_empty=True,
                                      populate_by_name=True)

    nats_url: str = "nats://127.0.0.1:4222"
    worker_enrollment_token: SecretStr | None = None
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    nats_creds: str | None = None
    provider: str = Field(default="strava", pattern=NAME_PATTERN)
    worker_name: str = Field(default="strava-fetcher", pattern=NAME_PATTERN)
    worker_package: str = ""  # empty: DEFAULT_WORKER_PACKAGE_PREFIX + provider (see _package_of_the_provider)
    instance_id: str = Field(default_factory=_default_instance_id, validation_alias=AliasChoices(
        "CAIRN_WORKER_INSTANCE_ID", "CAIRN_INSTANCE_ID"))  # the Strava worker's name first, as presence reads it
    release: str = WORKER_RELEASE
    ack_wait_s: float = Field(default=DEFAULT_ACK_WAIT_S, gt=0)
    # At least 2: with 1 every job would be termed on arrival, before it ever ran (no failure yet counts).
    term_after_deliveries: int = Field(default=TERM_AFTER_DELIVERIES, ge=2)  # before max_deliver: it checks it
    max_deliver: int = Field(default=DEFAULT_MAX_DELIVER, ge=UNLIMITED_MAX_DELIVER)
    max_in_flight: int = Field(default=DEFAULT_MAX_IN_FLIGHT, ge=1)
    task_start_deadline_s: float = Field(default=DEFAULT_TASK_START_DEADLINE_S, gt=0)
    discover_deadline_s: float = Field(default=DEFAULT_DISCOVER_DEADLINE_S, gt=0)
    exchange_deadline_s: float = Field(default=DEFAULT_EXCHANGE_DEADLINE_S, gt=0, le=MAX_EXCHANGE_DEADLINE_S)
    lease_ttl_s: float = Field(default=DEFAULT_LEASE_TTL_S, gt=0)
    shutdown_grace_s: float = Field(default=DEFAULT_SHUTDOWN_GRACE_S, ge=0)

    @field_validator("nats_url")
    @classmethod
    def _nats_scheme(cls, value: str) -> str:
        if not value.startswith(("nats://", "tls://", "ws://", "wss://")):
            raise ValueError("must be a nats:// URL")
        return value

    @field_validator("release")
    @classmethod
    def _release_or_dev_build(cls, value: str) -> str:
        if not (re.match(RELEASE_PATTERN, value) or is_dev_build(value)):
            raise ValueError("must be a release vX.Y.Z or a dev build (dev, dev-<id>, vX.Y.Z-dev.N)")
        return value

    @field_validator("max_deliver")
    @classmethod
    def _max_deliver_above_term(cls, value: int, info: ValidationInfo) -> int:
        """A finite MaxDeliver must leave room for our own term with its envelope: JetStream
        stops delivering at MaxDeliver without telling core anything."""
        term_after = info.data.get("term_after_deliveries")
        if value != UNLIMITED_MAX_DELIVER and term_after is not None and value <= term_after:
            raise ValueError(f"must be {UNLIMITED_MAX_DELIVER} (unlimited) or greater than "
                             f"CAIRN_TERM_AFTER_DELIVERIES ({term_after})")
        return value

    @model_validator(mode="after")
    def _pool_credentials(self) -> CairnSettings:
        """The pool's own credentials (``pool_variable``), where set, over the fleet-wide ones. Read
        here because their names depend on ``worker_name``; before ``_auth_modes`` checks them."""
        for name in POOL_CREDENTIALS:
            value = os.environ.get(pool_variable(self.worker_name, name), "").strip()
            if value:
                setattr(self, name, SecretStr(value) if name in SECRET_CREDENTIALS else value)
        return self

    @model_validator(mode="after")
    def _package_of_the_provider(self) -> CairnSettings:
        if not self.worker_package:
            self.worker_package = DEFAULT_WORKER_PACKAGE_PREFIX + self.provider
        return self

    @model_validator(mode="after")
    def _auth_modes(self) -> CairnSettings:
        if self.nats_password is not None and not self.nats_user:
            raise ValueError("CAIRN_NATS_PASSWORD needs CAIRN_NATS_USER")
        return self

    @property
    def redis_url(self) -> str:
        """``REDIS_URL``, as :class:`workers.redisconn.RedisSettings` (the one class reading it) validates it."""
        return redis_settings().redis_url

    @property
    def worker_key(self) -> str:
        return f"{self.worker_name}-{self.provider}"


def load_cairn_settings(**overrides: object) -> CairnSettings:
    settings = load_settings(CairnSettings, **overrides)
    for secret in (settings.worker_enrollment_token, settings.nats_password):
        if secret is not None:
            register_secret(secret.get_secret_value())
    return settings
