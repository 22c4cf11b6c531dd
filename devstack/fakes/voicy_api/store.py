"""The dev server's Mongo store: a real MongoDB when ``VOICY_DEV_MONGO_URL`` is set, mongomock otherwise.

Collections and field names are Voicy's (``transcriptionjobs``,
``workerclients``, ``voices``, ``transcriptionresultcaches``; reference §2),
so a real Voicy shell pointed at the same MongoDB would read the same data.
Every transition is one conditional ``find_one_and_update`` (compare-and-set),
as in the real server. mongomock is not atomic across threads, so every
operation runs under one lock; a real MongoDB gives the same guarantee itself.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import threading
from datetime import UTC, datetime
from typing import Any

import mongomock
import pymongo
from bson import ObjectId
from pymongo import ReturnDocument

DB_NAME = "voicy_dev"
TOKEN_PREFIX = "voicy_worker_"
TOKEN_BYTES = 32


def now() -> datetime:
    """Naive UTC with millisecond precision, as Mongo stores it, so reads and writes compare equal."""
    t = datetime.now(UTC)
    return t.replace(microsecond=t.microsecond // 1000 * 1000, tzinfo=None)


def sha256_hex(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """Voicy's format: ``voicy_worker_`` + base64url(32 random bytes) without padding (56 chars)."""
    raw = base64.urlsafe_b64encode(secrets.token_bytes(TOKEN_BYTES)).decode().rstrip("=")
    return TOKEN_PREFIX + raw


class DuplicateClientError(ValueError):
    """``yarn worker:create-client`` refuses a name that exists (unique index on ``name``)."""


class Store:
    def __init__(self, mongo_url: str | None = None) -> None:
        mongo_url = mongo_url or os.environ.get("VOICY_DEV_MONGO_URL")
        if mongo_url:
            self.client: Any = pymongo.MongoClient(mongo_url, tz_aware=False)
        else:
            self.client = mongomock.MongoClient(tz_aware=False)
        self.db = self.client[DB_NAME]
        self.jobs = self.db.transcriptionjobs
        self.clients = self.db.workerclients
        self.voices = self.db.voices
        self.caches = self.db.transcriptionresultcaches
        self._lock = threading.RLock()

    # --- jobs -----------------------------------------------------------------------------------
    def update_job(self, flt: dict[str, Any], update: dict[str, Any], t: datetime | None = None,
                   sort: list[tuple[str, int]] | None = None) -> dict[str, Any] | None:
        """One atomic conditional update; returns the document after it, or None (no match)."""
        update = {k: dict(v) for k, v in update.items()}
        update.setdefault("$set", {})["updatedAt"] = t or now()
        with self._lock:
            return self.jobs.find_one_and_update(flt, update, sort=sort,
                                                 return_document=ReturnDocument.AFTER)

    def update_jobs(self, flt: dict[str, Any], update: dict[str, Any], t: datetime | None = None) -> int:
        """``updateMany``: one update on every matching job; returns how many matched."""
        update = {k: dict(v) for k, v in update.items()}
        update.setdefault("$set", {})["updatedAt"] = t or now()
        with self._lock:
            return int(self.jobs.update_many(flt, update).matched_count)

    def find_job(self, flt: dict[str, Any]) -> dict[str, Any] | None:
        with self._lock:
            return self.jobs.find_one(flt)

    def insert_job(self, doc: dict[str, Any]) -> str:
        with self._lock:
            return str(self.jobs.insert_one(doc).inserted_id)

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        return self.find_job({"_id": ObjectId(job_id)})

    # --- other collections ------------------------------------------------------------------------
    def upsert(self, collection: Any, flt: dict[str, Any], fields: dict[str, Any], t: datetime) -> None:
        with self._lock:
            collection.update_one(flt, {"$set": {**fields, "updatedAt": t},
                                        "$setOnInsert": {"createdAt": t}}, upsert=True)

    # --- worker clients ---------------------------------------------------------------------------
    def authenticate(self, token: str, t: datetime) -> dict[str, Any] | None:
        """``findOneAndUpdate({tokenHash, enabled: true}, {$set: {lastSeenAt}})`` (reference §1.0)."""
        with self._lock:
            return self.clients.find_one_and_update(
                {"tokenHash": sha256_hex(token), "enabled": True},
                {"$set": {"lastSeenAt": t, "updatedAt": t}}, return_document=ReturnDocument.AFTER)

    def touch_client(self, client_id: Any, fields: dict[str, Any]) -> None:
        with self._lock:
            self.clients.update_one({"_id": client_id}, {"$set": fields})

    def create_client(self, name: str, token: str | None = None) -> str:
        """Like ``yarn worker:create-client``: returns the token once, stores only its SHA-256."""
        token = token or new_token()
        t = now()
        with self._lock:
            if self.clients.find_one({"$or": [{"name": name}, {"tokenHash": sha256_hex(token)}]}):
                raise DuplicateClientError(f"worker client {name!r} (or its token) already exists")
            self.clients.insert_one({"name": name, "tokenHash": sha256_hex(token), "enabled": True,
                                     "createdAt": t, "updatedAt": t})
        return token

    def disable_client(self, name: str) -> None:
        """The documented way to revoke a token: set ``enabled`` to false."""
        with self._lock:
            if self.clients.update_one({"name": name}, {"$set": {"enabled": False}}).matched_count == 0:
                raise KeyError(name)
