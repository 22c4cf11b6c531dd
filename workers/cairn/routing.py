"""Publish routing (contract §5): JetStream for subjects a stream captures, core NATS for the rest."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors

from workers.cairn.contract import subjects
from workers.cairn.refusals import PermissionRefused, guarded
from workers.errors import RetryableJobError

PUBLISH_TIMEOUT_S = 10.0  # one JetStream publish including its PubAck
STREAM_LOOKUP_TIMEOUT_S = 5.0
NEGATIVE_ROUTE_TTL_S = 30.0  # "no stream" may change when core (re)creates streams
log = logging.getLogger(__name__)

ROUTE_CACHE_MAX_ENTRIES = 4096  # reconcile result subjects carry account ids: bound the cache
# A stream publish with a Nats-Msg-Id that gets no PubAck (NATS unreachable, a partition) is retried
# under the same id for this long (R1's minute; inside JetStream's 2-min default duplicate window),
# backing off from the first to the second figure.
PUBLISH_RETRY_BOUND_S = 60.0
PUBLISH_RETRY_INITIAL_S, PUBLISH_RETRY_MAX_S = 0.5, 5.0


class PublishError(RetryableJobError):
    """An envelope, an inline result or a sub-job could not be published: transient, NAK and retry.

    Its message names the subject and an exception type only, never the payload.
    """

    code = "publish_failed"


class PublishRouter:
    """JetStream publish for stream-captured subjects, core publish otherwise; decided once per subject.

    A JetStream publish to a subject no stream captures waits for an ack that never comes, so
    the server is asked once per subject (``$JS.API.STREAM.NAMES``): a stream is cached for
    good, "no stream" for ``NEGATIVE_ROUTE_TTL_S`` (core may create it). A refused subject
    raises ``PermissionRefused`` (permanent), never :class:`PublishError`. Sync on top of
    ``NatsThread``; connection objects are resolved in the calling thread, never on the loop.
    """

    def __init__(self, nats: Any, *, negative_ttl_s: float = NEGATIVE_ROUTE_TTL_S,
                 retry_bound_s: float = PUBLISH_RETRY_BOUND_S) -> None:
        self._nats = nats
        self._negative_ttl_s = negative_ttl_s
        self._retry_bound_s = retry_bound_s
        self._cache: OrderedDict[str, tuple[str | None, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.lookups = 0  # how many times the server was asked (tests, metrics)

    def stream_for(self, subject: str) -> str | None:
        """The stream capturing ``subject`` or None; raises :class:`PublishError` if the lookup fails."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(subject)
            if hit is not None and (hit[0] is not None or now < hit[1]):
                self._cache.move_to_end(subject)
                return hit[0]
        stream = self._lookup(subject)
        with self._lock:
            self._cache[subject] = (stream, now + self._negative_ttl_s)
            while len(self._cache) > ROUTE_CACHE_MAX_ENTRIES:
                self._cache.popitem(last=False)
        return stream

    def forget(self, subject: str) -> None:
        with self._lock:
            self._cache.pop(subject, None)

    def _lookup(self, subject: str) -> str | None:
        nc = self._nats.nc  # resolved in this thread: a first use connects, never on the loop
        body = json.dumps({"subject": subject}).encode()

        async def ask() -> Any:
            return await guarded(self._nats, nc.request(subjects.STREAM_NAMES_API, body,
                                                        timeout=STREAM_LOOKUP_TIMEOUT_S), subjects.STREAM_NAMES_API)

        self.lookups += 1
        try:
            msg = self._nats.run(ask(), STREAM_LOOKUP_TIMEOUT_S + 1.0)
        except nats.errors.NoRespondersError:
            return None  # no JetStream on this server: nothing captures anything
        except PermissionRefused:
            raise  # permanent: reported once by the connection, never retried as transient
        except Exception as exc:  # noqa: BLE001 - timeout, disconnected: retry later, cache nothing
            raise PublishError(f"stream lookup for {subject}: {type(exc).__name__}") from None
        try:
            reply = json.loads(msg.data or b"{}")
        except ValueError:
            raise PublishError(f"stream lookup for {subject}: reply is not JSON") from None
        if reply.get("error"):
            raise PublishError(f"stream lookup for {subject}: {str(reply['error'])[:200]}")
        streams = reply.get("streams") or []
        return str(streams[0]) if streams else None

    def publish(self, subject: str, data: bytes, msg_id: str | None = None,
                headers: dict[str, str] | None = None, timeout_s: float = PUBLISH_TIMEOUT_S) -> Any:
        """Publish ``data``; returns the PubAck for stream subjects (a dedup hit is success), else None."""
        all_headers = dict(headers or {})
        if msg_id:
            all_headers["Nats-Msg-Id"] = msg_id
        stream = self.stream_for(subject)
        if stream is not None:
            js = self._nats.js

            async def js_publish() -> Any:
                return await guarded(self._nats, js.publish(subject, data, timeout=timeout_s,
                                                            headers=all_headers or None), subject)

            return self._js_publish_retried(subject, js_publish, msg_id, timeout_s)
        nc = self._nats.nc

        async def core_publish() -> None:
            async def publish_and_flush() -> None:
                await nc.publish(subject, data, headers=all_headers or None)
                await nc.flush(timeout=timeout_s)  # a refusal's -ERR arrives before the flush's PONG

            await guarded(self._nats, publish_and_flush(), subject)

        try:
            self._nats.run(core_publish(), timeout_s + 1.0)
        except PermissionRefused:
            raise
        except Exception as exc:  # noqa: BLE001
            raise PublishError(f"publish {subject}: {type(exc).__name__}") from None
        return None

    def _js_publish_retried(self, subject: str, js_publish: Callable[[], Awaitable[Any]], msg_id: str | None,
                            timeout_s: float) -> Any:
        """``js_publish()`` until a PubAck (a dedup hit included), retried with the same msg id.

        No PubAck does not mean not stored: nats-py buffers what it cannot send, and TCP
        retransmits what a partition held back, so the message may land after we stopped
        waiting. Giving up then (a NAK, and a redelivery publishing ``:d<n+1>``) would store the
        job's result twice; retrying under the same ``Nats-Msg-Id`` stores it once, whichever
        copy lands first. Without a msg id there is no dedup, so no retry.
        """
        deadline = time.monotonic() + self._retry_bound_s
        delay = PUBLISH_RETRY_INITIAL_S
        while True:
            try:
                return self._nats.run(js_publish(), timeout_s + 1.0)
            except PermissionRefused:
                raise
            except Exception as exc:  # noqa: BLE001 - timeout, stream gone, disconnected: all transient
                if not msg_id or time.monotonic() + delay >= deadline:
                    self.forget(subject)  # the stream may have changed; ask again next time
                    raise PublishError(f"publish {subject}: {type(exc).__name__}") from None
                log.info("publish %s unanswered (%s); again in %.1fs with the same Nats-Msg-Id", subject,
                         type(exc).__name__, delay)
            time.sleep(delay)  # NATS unreachable: nothing to await but its return
            delay = min(delay * 2, PUBLISH_RETRY_MAX_S)
