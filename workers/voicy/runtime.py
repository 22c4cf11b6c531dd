"""What one process needs for Voicy work, built once per process after fork: ``VoicyRuntime``."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import redis

from workers.lease import Leases
from workers.redisconn import sync_client
from workers.voicy.client import VoicyClient
from workers.voicy.fleet import Fleet
from workers.voicy.media_store import MediaStore, media_store_from_url
from workers.voicy.settings import VoicySettings, load_voicy_settings
from workers.voicy.telegram import TelegramFiles

LEASE_NAMESPACE = "voicy"
QUEUED_LEASE_TTL_S = 6 * 3600.0  # a queued task is safe in the broker; only a taken one can be lost
# A grant whose task is not sent yet lives this many lease TTLs: as long as a dead worker's
# running lease, so a process killed between granting and sending is recovered as quickly.
PENDING_GRANT_LEASE_TTLS = 1.0


@dataclass
class VoicyRuntime:
    """Everything one process needs for Voicy work; built once per process, after fork.

    In its own module, with the lease constants every step shares, because the steps
    (``pipeline``, ``transcription``, ``outcomes``) must not import each other in a circle.
    """

    settings: VoicySettings
    client: VoicyClient
    store: MediaStore
    fleet: Fleet
    leases: Leases
    redis: redis.Redis

    @classmethod
    def from_env(cls, redis_url: str) -> VoicyRuntime:
        settings = load_voicy_settings()
        assert settings.media_store is not None  # VoicySettings._derive defaults it to the work directory
        client = sync_client(redis_url)
        return cls(settings=settings, client=VoicyClient.from_settings(settings),
                   store=media_store_from_url(settings.media_store), fleet=Fleet(client),
                   leases=Leases(client, LEASE_NAMESPACE), redis=client)

    @functools.cached_property
    def telegram(self) -> TelegramFiles:
        """The process's one Bot API client, its connections pooled across downloads. Made at the first
        download: its SSL context costs about 30 ms of CPU, and bridges and gpu workers never download."""
        return TelegramFiles(self.settings)

    def close(self) -> None:
        """Close every connection the runtime holds; a process that is done with it calls this."""
        self.client.close()
        if "telegram" in self.__dict__:  # made only by a download
            self.telegram.close()
        self.redis.close()

    @property
    def lease_ttl_s(self) -> float:
        return self.settings.lease_ttl_ms / 1000.0

    @property
    def pending_grant_ttl_s(self) -> float:
        """TTL of a grant until ``pipeline.confirm_grant`` (its task not sent yet)."""
        return self.lease_ttl_s * PENDING_GRANT_LEASE_TTLS
