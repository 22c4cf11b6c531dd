"""What Voicy does on the Telegram side, recorded instead of sent (reference §4, §5).

There is no bot here: a "visible edit" is appended to ``Publisher.edits`` when
the real server would edit (or send) a Telegram message, so tests can count
them. The throttle, the channel rule, the missing-status-message rule and the
``lastProgressPublishedAt`` bookkeeping follow §4 exactly; the final publish
chunks the transcript at 4000 UTF-16 units, then the ``Voice`` record and the
result cache are written as §5.3/§5.4 describe.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from devstack.fakes.voicy_api.policy import Policy
from devstack.fakes.voicy_api.store import Store
from devstack.fakes.voicy_api.validate import js_slice

TELEGRAM_CHUNK_UNITS = 4000
EMPTY_RESULT_TEXT = "Done, but no text was detected."


class PublishError(RuntimeError):
    """The (simulated) Telegram call failed; ``/result`` turns this into 500 ``worker_api_error``."""


def _collapse(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def plain_text(job: dict[str, Any], partial: bool) -> str:
    """The whitespace-collapsed preview text (§4 "partial" and §5.2 silent chats)."""
    parts = job.get("partialResultParts" if partial else "resultParts") or []
    joined = " ".join(_collapse(p.get("text") or "") for p in parts if _collapse(p.get("text") or ""))
    if joined:
        return joined
    fallback = (job.get("partialResultText") or job.get("resultText")) if partial else job.get("resultText")
    return _collapse(fallback or "")


def transcript_text(job: dict[str, Any]) -> str:
    """Non-silent final text: trimmed ``resultText``, else ``timeCode:\\ntext`` parts (§5.2)."""
    text = (job.get("resultText") or "").strip()
    parts = job.get("resultParts") or []
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("parts"), list) and parsed["parts"]:
            parts, text = parsed["parts"], ""
    if text:
        return text
    return "\n".join(f"{p['timeCode']}:\n{p.get('text', '')}" if p.get("timeCode") else p.get("text", "")
                     for p in parts if isinstance(p, dict))


def chunks(text: str) -> list[str]:
    """Consecutive pieces of at most 4000 UTF-16 units; empty text is one empty chunk."""
    out, rest = [], text
    while True:
        piece = js_slice(rest, TELEGRAM_CHUNK_UNITS)
        out.append(piece)
        rest = rest[len(piece):]
        if not rest:
            return out


class Publisher:
    def __init__(self, store: Store, policy: Policy, clock: Callable[[], datetime],
                 fail_publish: Callable[[], bool]) -> None:
        self.store, self.policy, self.clock = store, policy, clock
        self._fail_publish = fail_publish
        self.edits: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def _record(self, job: dict[str, Any], phase: str, text: str, kind: str = "edit") -> None:
        with self._lock:
            self.edits.append({"jobId": str(job["_id"]), "phase": phase, "kind": kind, "text": text,
                               "at": self.clock()})

    def progress(self, job: dict[str, Any], phase: str, force: bool = False) -> bool:
        """``publishTranscriptionJobProgress``; True when a visible edit happened."""
        if self.policy.publish_disabled or job.get("telegramChatType") == "channel":
            return False
        t = self.clock()
        last = job.get("lastProgressPublishedAt")
        interval = timedelta(milliseconds=self.policy.progress_edit_interval_ms)
        if not force and last is not None and t - last < interval:
            return False
        if job.get("silent"):
            text = js_slice(plain_text(job, partial=True), TELEGRAM_CHUNK_UNITS)
            if phase != "partial" or not text:
                return False
            fields: dict[str, Any] = {"lastProgressPublishedAt": t}
            if job.get("statusMessageId") is None:
                fields["statusMessageId"] = job["sourceMessageId"] + 1
            self._record(job, phase, text, kind="send" if "statusMessageId" in fields else "edit")
            self.store.update_job({"_id": job["_id"]}, {"$set": fields}, t)
            return True
        if job.get("statusMessageId") is None:
            return False
        self._record(job, phase, plain_text(job, partial=True) if phase == "partial" else "")
        if phase == "partial":
            self.store.update_job({"_id": job["_id"]}, {"$set": {"lastProgressPublishedAt": t}}, t)
        return True

    def completed(self, job: dict[str, Any]) -> None:
        """``publishCompletedTranscriptionJob``: edit/send the chunks, then store the Voice record."""
        if not self.policy.publish_disabled:
            if self._fail_publish():
                raise PublishError("telegram publish failed")
            silent = bool(job.get("silent"))
            text = plain_text(job, partial=False) if silent else transcript_text(job)
            if silent and not text:
                self._record(job, "completed", "", kind="delete")
            else:
                pieces = chunks(text)
                pieces[0] = pieces[0] or EMPTY_RESULT_TEXT
                first_kind = "edit" if job.get("statusMessageId") is not None else "send"
                for n, piece in enumerate(pieces):
                    self._record(job, "completed", piece, kind=first_kind if n == 0 else "send")
        self._store_voice(job)

    def _store_voice(self, job: dict[str, Any]) -> None:
        """The legacy ``Voice`` record, upserted on ``(chatId, messageId)`` (§5.3)."""
        t = self.clock()
        url = next((v for v in (job.get("sourceUrl"), job.get("localSourcePath"), job.get("filePath"),
                                job.get("fileId")) if v), "")
        fields: dict[str, Any] = {
            "url": url, "status": "completed", "chatId": job.get("chatId"),
            "messageId": job.get("sourceMessageId"), "ackMessageId": job.get("statusMessageId"),
            "fileId": job.get("fileId"), "fileSize": job.get("fileSize"), "mimeType": job.get("mimeType"),
            "fileName": job.get("fileName"), "sourceType": job.get("sourceKind"),
            "claimedAt": job.get("claimedAt"), "completedAt": job.get("completedAt") or t,
            "duration": job.get("duration", 0),
            "language": job.get("recognitionLanguage") or job.get("recognitionLanguageHint") or "auto",
            "text": transcript_text(job), "workerEngine": job.get("workerEngine"),
            "textWithTimecodes": [[p.get("timeCode") or "", p.get("text", "")]
                                  for p in job.get("resultParts") or [] if isinstance(p, dict)],
        }
        for src, dst in (("requestedByUserId", "requestedBy"), ("forwardedFromUserId", "forwardFromId")):
            if job.get(src):
                fields[dst] = int(job[src])
        fields = {k: v for k, v in fields.items() if v is not None}
        self.store.upsert(self.store.voices, {"chatId": job.get("chatId"),
                                              "messageId": job.get("sourceMessageId")}, fields, t)

    def cache(self, job: dict[str, Any]) -> None:
        """``cacheCompletedTranscriptionJob`` (§5.4): later messages with the same file hit this."""
        key = job.get("mediaCacheKey")
        if not key:
            return
        t = self.clock()
        fields = {k: job.get(k) for k in ("fileUniqueId", "sourceKind", "resultText", "resultParts",
                                          "recognitionLanguage", "workerEngine", "workerEngineMetadata",
                                          "duration")}
        fields = {k: v for k, v in fields.items() if v is not None}
        fields.update(cacheKey=key, completedAt=t, expiresAt=t + timedelta(days=self.policy.cache_ttl_days))
        self.store.upsert(self.store.caches, {"cacheKey": key}, fields, t)

