"""Core release compatibility (contract §1 Versioning), for every part of the pool that talks to core."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

from workers.cairn.contract import subjects
from workers.cairn.settings import is_dev_build  # the one dev-build rule, shared with CAIRN_RELEASE
from workers.errors import SwitchyardError

log = logging.getLogger(__name__)

KV_CORE = subjects.CORE_BUCKET
KV_CORE_INFO_KEY = subjects.CORE_INFO_KEY
CORE_CHECK_TTL_S = 60.0  # how long a process trusts its last verdict before reading ``info`` again
CORE_CHECK_TIMEOUT_S = 5.0  # one KV read of ``cairn_core``/``info``
_RELEASE_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+].*)?$")


class IncompatibleCoreError(SwitchyardError):
    """Core's release is not one this worker may run against (contract §1)."""


def parse_release(release: str, side: str = "core") -> tuple[int, int, int]:
    """(major, minor, patch) of a non-dev release; the error names whose release it is."""
    match = _RELEASE_RE.match(release.strip())
    if not match:
        raise IncompatibleCoreError(f"{side} release {release!r} is neither a vMAJOR.MINOR.PATCH version "
                                    "nor a dev build")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def compatible(worker_release: str, core_release: str) -> bool:
    """Contract §1: pre-1.0 same major.minor; from 1.0 same major, worker minor ≤ core minor.

    Dev builds are exempt on either side, by the rule ``CAIRN_RELEASE`` is validated with
    (:func:`workers.cairn.settings.is_dev_build`).
    """
    if is_dev_build(worker_release) or is_dev_build(core_release):
        return True
    w_major, w_minor, _ = parse_release(worker_release, "worker")
    c_major, c_minor, _ = parse_release(core_release, "core")
    if w_major != c_major:
        return False
    if w_major == 0:
        return w_minor == c_minor
    return w_minor <= c_minor


def decode_info(raw: bytes) -> str:
    """``info`` is JSON ``{"release": "v0.7.0", ...}`` or a bare release string."""
    text = raw.decode("utf-8", errors="replace").strip()
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, dict):
        return str(value.get("release", "")).strip()
    return str(value).strip()


@dataclass(frozen=True)
class CoreVerdict:
    """What this worker may do against the core it sees. ``core_release`` None: core publishes none."""

    core_release: str | None
    compatible: bool
    reason: str


async def core_verdict(js: JetStreamContext, worker_release: str) -> CoreVerdict:
    """Read ``cairn_core``/``info`` and judge it; the one compatibility decision of the pool."""
    try:
        kv = await js.key_value(KV_CORE)
        entry = await kv.get(KV_CORE_INFO_KEY)
    except (BucketNotFoundError, KeyNotFoundError, NotFoundError):
        return CoreVerdict(None, True, f"core publishes no release (no {KV_CORE}/{KV_CORE_INFO_KEY}); "
                                       "running without a compatibility check")
    core_release = decode_info(entry.value or b"")
    if not core_release:
        return CoreVerdict(None, True, f"core's {KV_CORE}/{KV_CORE_INFO_KEY} carries no release; "
                                       "running without a compatibility check")
    try:
        ok = compatible(worker_release, core_release)
    except IncompatibleCoreError as exc:
        return CoreVerdict(core_release, False, str(exc))
    if not ok:
        return CoreVerdict(core_release, False,
                           f"core release {core_release} is incompatible with this worker's release "
                           f"{worker_release} (contract §1: before 1.0 major.minor must match)")
    return CoreVerdict(core_release, True,
                       f"core release {core_release} is compatible with worker release {worker_release}")


async def check_core_release(js: JetStreamContext, worker_release: str) -> str | None:
    """Refuse an incompatible core; return core's release, or None when it publishes none."""
    verdict = await core_verdict(js, worker_release)
    if not verdict.compatible:
        raise IncompatibleCoreError(verdict.reason)
    if verdict.core_release is None:
        log.warning("%s", verdict.reason)
    else:
        log.info("%s", verdict.reason)
    return verdict.core_release


class CoreGate:
    """Per-process answer to "may this pool advertise itself to core now?", cached for ``ttl_s``.

    "Refuse to run" covers more than consuming: the presence and manifest writers in the Celery
    workers ask this gate, or core would advertise a pool that consumes nothing. A missing
    ``info`` record (older core) is a warning, not a refusal.

    ``allows(nats)`` reads ``info`` through the process's NATS thread at most
    once per ``ttl_s``. A refusal is logged as an error when the verdict
    changes (another core release, or compatible → incompatible), and the
    return to a compatible core is logged once too; repeated heartbeats stay
    quiet. ``clock`` is monotonic seconds (a test clock makes the TTL visible).
    """

    def __init__(self, worker_release: str, *, ttl_s: float = CORE_CHECK_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.worker_release, self.ttl_s, self.clock = worker_release, ttl_s, clock
        self._lock = threading.Lock()
        self._verdict: CoreVerdict | None = None
        self._checked_at = float("-inf")

    def allows(self, nats: Any) -> bool:
        with self._lock:
            now = self.clock()
            if self._verdict is not None and now - self._checked_at < self.ttl_s:
                return self._verdict.compatible
        js = nats.js  # resolve (and maybe connect) off the loop thread
        verdict = nats.run(core_verdict(js, self.worker_release), CORE_CHECK_TIMEOUT_S)
        with self._lock:
            previous, self._verdict, self._checked_at = self._verdict, verdict, self.clock()
        if verdict != previous:
            self._log_change(previous, verdict)
        return verdict.compatible

    def forget(self) -> None:
        """Drop the cached verdict: the next ``allows`` reads ``info`` again."""
        with self._lock:
            self._verdict, self._checked_at = None, float("-inf")

    @staticmethod
    def _log_change(previous: CoreVerdict | None, verdict: CoreVerdict) -> None:
        if not verdict.compatible:
            log.error("%s; presence and manifest are not written until core is compatible", verdict.reason)
        elif verdict.core_release is None:
            log.warning("%s", verdict.reason)
        elif previous is not None and not previous.compatible:
            log.info("%s; presence and manifest are written again", verdict.reason)
