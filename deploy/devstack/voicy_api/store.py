"""The dev server's Mongo store: a real MongoDB when ``VOICY_DEV_MONGO_URL`` is set, mongomock otherwise.

Every transition is one conditional ``find_one_and_update`` (compare-and-set),
as in the real server. mongomock is not atomic across threads, so updates run
under one lock; a real MongoDB gives the same guarantee on its own.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from datetime import datetime, timezone
from typing import Any

from pymongo import ReturnDocument

DB_NAME = "voicy_dev"
TOKEN_BYTES = 32


def now() -> datetime:
    """Mongo keeps milliseconds; so do we, so reads and writes compare equal."""
    t = datetime.now(timezone.utc)
    return t.replace(microsecond=t.microsecond // 1000 * 1000, tzinfo=None)


def sha256_hex(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Store:
    def __init__(self, mongo_url: str | None = None) -> None:
        mongo_url = mongo_url or os.environ.get("VOICY_DEV_MONGO_URL")
        if mongo_url:
            import pymongo

            self.client: Any = pymongo.MongoClient(mongo_url)
        else:
            import mongomock

            self.client = mongomock.MongoClient(tz_aware=False)
        self.db = self.client[DB_NAME]
        self.jobs = self.db.transcriptionjobs
        self.clients = self.db.workerclients
        self.voices = self.db.voices
        self._lock = threading.Lock()

    def update_one_job(self, flt: dict[str, Any], update: dict[str, Any],
                       sort: list[tuple[str, int]] | None = None) -> dict[str, Any] | None:
        update = dict(update)
        update.setdefault("$set", {})["updatedAt"] = now()
        with self._lock:
            return self.jobs.find_one_and_update(flt, update, sort=sort,
                                                 return_document=ReturnDocument.AFTER)

    def authenticate(self, token: str) -> dict[str, Any] | None:
        with self._lock:
            return self.clients.find_one_and_update(
                {"tokenHash": sha256_hex(token), "enabled": True}, {"$set": {"lastSeenAt": now()}},
                return_document=ReturnDocument.AFTER)

    def create_client(self, name: str, token: str | None = None) -> str:
        """Like ``yarn worker:create-client``: returns the token once, stores only its SHA-256."""
        token = token or "vwk_" + secrets.token_urlsafe(TOKEN_BYTES)
        self.clients.update_one({"name": name}, {"$set": {"name": name, "tokenHash": sha256_hex(token),
                                                          "enabled": True}}, upsert=True)
        return token

    def disable_client(self, name: str) -> None:
        self.clients.update_one({"name": name}, {"$set": {"enabled": False}})
