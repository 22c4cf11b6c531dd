"""One NATS connection per process, on a background asyncio loop, usable from sync code."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import nats
import nkeys
from nats.errors import ConnectionClosedError, StaleConnectionError, UnexpectedEOF

from workers import dead_peers
from workers.cairn.refusals import POOL_ROLE, PermissionRefused, Refusals, fault_component, guarded
from workers.cairn.settings import CairnSettings
from workers.errors import RetryableJobError
from workers.faults import record_fault
from workers.logs import redact
from workers.outage import Outage
from workers.redisconn import sync_client

T = TypeVar("T")
log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 10.0
RECONNECT_WAIT_S = 2.0
JETSTREAM_TIMEOUT_S = 10.0
DRAIN_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 5.0  # token/creds/presign requests (the published worker uses 3-5 s)
LOOP_HANDOFF_S = 1.0  # extra wait for the loop thread beyond a request's own timeout
NATS_ERROR_HEADER = "Nats-Error"
# No client-side buffer while reconnecting: nats-py would queue a result publish made during an
# outage, report a timeout to the task (which then NAKs), and send it once NATS is back: the
# result published *and* the job run again (C4). Refused at once instead, the task knows it
# did not publish.
NO_RECONNECT_BUFFER = 0
# What nats-py reports while the server is away (a restart): one outage, logged once (R1).
NATS_UNAVAILABLE = (OSError, asyncio.TimeoutError, nats.errors.TimeoutError, UnexpectedEOF,
                    StaleConnectionError, ConnectionClosedError)
REFUSAL_MAX_CHARS = 200


class NatsUnavailableError(RetryableJobError):
    """NATS is reconnecting (a server restart): nothing was sent; a transient failure of the job."""


class CoreRequestError(Exception):
    """A request/reply to core failed: no responder, timeout, a refusal or a malformed reply.

    Transient from a job's point of view (NAK): core was unreachable or refused
    this one request. The message names the subject and the cause, never the body.
    """


class CoreUnanswered(CoreRequestError):
    """No answer at all (a timeout, or NATS unreachable): core may be well and only the network not."""


def _fresh_nkey_seed() -> bytes:
    """A new user nkey seed (``SU...``) for this connection only."""
    return nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)


def connect_options(settings: CairnSettings) -> dict[str, Any]:
    """``nats.connect`` keyword arguments for the configured authentication mode.

    Production sends ``CAIRN_WORKER_ENROLLMENT_TOKEN`` as the CONNECT token, the worker name as
    connection name and a fresh user nkey per connection (reference/cairn.md §2.11, §3.1); dev
    uses anonymous, user/password or a creds file.
    """
    options: dict[str, Any] = {
        "servers": [settings.nats_url], "name": settings.worker_name,
        "connect_timeout": CONNECT_TIMEOUT_S, "reconnect_time_wait": RECONNECT_WAIT_S,
        "max_reconnect_attempts": -1, "allow_reconnect": True,
        "ping_interval": dead_peers.NATS_PING_INTERVAL_S,
        "max_outstanding_pings": dead_peers.NATS_MAX_OUTSTANDING_PINGS,
    }
    if settings.worker_enrollment_token is not None:
        options["token"] = settings.worker_enrollment_token.get_secret_value()
        options["nkeys_seed_str"] = _fresh_nkey_seed().decode()  # nats-py signs the nonce with it
    elif settings.nats_creds:
        options["user_credentials"] = settings.nats_creds
    elif settings.nats_user:
        options["user"] = settings.nats_user
        if settings.nats_password is not None:
            options["password"] = settings.nats_password.get_secret_value()
    return {k: v for k, v in options.items() if v is not None}


class NatsThread:
    """A daemon event-loop thread holding one NATS connection (connects lazily).

    Celery tasks are sync and nats-py is asyncio; a connection per task would cost a handshake
    (and under auth-callout a JWT mint) each time, so each worker process owns one after fork.
    """

    def __init__(self, settings: CairnSettings) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="nats-loop", daemon=True)
        self._thread.start()
        self._nc: Any = None
        self._js: Any = None
        self._lock = threading.Lock()
        self._closed = False
        self.outage = Outage("NATS")
        self.refusals = Refusals(fault_component(POOL_ROLE, settings.worker_name), record=fault_recorder(settings))

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the connection's loop and return its result (raises its exception).

        A refusal NATS reports meanwhile raises :class:`PermissionRefused` at once (a process
        runs one job at a time: what was refused is what this call did), never a timeout.
        Never call it from the loop thread itself (a coroutine waiting on its own loop deadlocks).
        """
        if self.loop.is_closed():
            coro.close()
            raise RuntimeError("NatsThread is closed")
        try:
            return asyncio.run_coroutine_threadsafe(self.refusals.guard(coro), self.loop).result(timeout)
        except nats.errors.OutboundBufferLimitError:  # refused while reconnecting (NO_RECONNECT_BUFFER)
            raise NatsUnavailableError("NATS is reconnecting; nothing was sent") from None

    def _ensure(self) -> None:
        if threading.current_thread() is self._thread and (self._nc is None or self._nc.is_closed):
            raise RuntimeError("NatsThread.nc/js first used on its own loop: resolve them before awaiting")
        with self._lock:
            if self._nc is None or self._nc.is_closed:
                async def connect() -> Any:
                    return await nats.connect(**connect_options(self.settings), **self._callbacks(),
                                              pending_size=NO_RECONNECT_BUFFER)

                self._nc = self.run(connect(), CONNECT_TIMEOUT_S + 5)
                self._js = self._nc.jetstream(timeout=JETSTREAM_TIMEOUT_S)

    def _callbacks(self) -> dict[str, Any]:
        """nats-py's default error callback logs a traceback on every failed reconnect attempt
        (every ``RECONNECT_WAIT_S`` in every pool process); an outage is logged once instead."""
        outage = self.outage

        refusals = self.refusals

        async def error_cb(exc: Exception) -> None:
            if refusals.note(exc):  # a Permissions Violation: permanent, reported once (not an outage)
                return
            if isinstance(exc, NATS_UNAVAILABLE) or outage.down:
                outage.failed("connection", exc)
            else:
                log.warning("NATS error: %s", redact(f"{type(exc).__name__}: {exc}"))

        async def disconnected_cb() -> None:
            if self._closed:  # our own drain in close(): not an outage
                return
            outage.failed("disconnected; reconnecting")

        async def reconnected_cb() -> None:
            refusals.clear()  # a new connection (a new JWT under auth-callout): permissions may differ
            outage.ok()

        return {"error_cb": error_cb, "disconnected_cb": disconnected_cb, "reconnected_cb": reconnected_cb}

    @property
    def nc(self) -> Any:
        self._ensure()
        return self._nc

    @property
    def js(self) -> Any:
        self._ensure()
        return self._js

    def close(self) -> None:
        """Drain the connection, cancel what is left on the loop, stop and close it (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._nc is not None and not self._nc.is_closed:
            try:
                self.run(self._nc.drain(), DRAIN_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - closing on the way out
                try:
                    self.run(self._nc.close(), DRAIN_TIMEOUT_S)
                except Exception:  # noqa: BLE001
                    pass

        async def cancel_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.run(cancel_rest(), DRAIN_TIMEOUT_S)
        except Exception:  # noqa: BLE001
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(DRAIN_TIMEOUT_S)
        if not self._thread.is_alive():
            self.loop.close()


def fault_recorder(settings: CairnSettings) -> Callable[[str, str], None]:
    """Records a refusal as a standing fault (``workers.faults``) in the fleet's Redis; a client per
    call: refusals are rare, and the caller runs it off the event loop."""
    def record(component: str, detail: str) -> None:
        client = sync_client(settings.redis_url)
        try:
            record_fault(client, component, detail)
        finally:
            client.close()

    return record


def request_json(nats: Any, subject: str, body: dict[str, Any],
                 timeout_s: float = REQUEST_TIMEOUT_S) -> dict[str, Any]:
    """Core request/reply from sync code: ``body`` as compact JSON, the reply as a JSON object.

    A ``Nats-Error`` reply (core's refusal, reference §2.4) or no reply is :class:`CoreRequestError`;
    a subject NATS refuses is the permanent ``PermissionRefused`` (``workers.cairn.refusals``).

    ``nats`` is a :class:`NatsThread` (or anything with ``nc`` and ``run``, like
    the bridge's loop adapter). ``nc`` is resolved here, in the calling thread,
    because a first use connects and must never happen on the loop thread.
    """
    data = json.dumps(body, separators=(",", ":")).encode()
    nc = nats.nc

    async def call() -> Any:
        return await guarded(nats, nc.request(subject, data, timeout=timeout_s), subject)

    try:
        msg = nats.run(call(), timeout_s + LOOP_HANDOFF_S)
    except PermissionRefused:
        raise  # permanent: never a "try again" CoreRequestError
    except Exception as exc:  # noqa: BLE001 - timeout, no responders, disconnected
        unanswered = isinstance(exc, (TimeoutError, NatsUnavailableError))  # nats-py's timeouts are TimeoutErrors
        raise (CoreUnanswered if unanswered else CoreRequestError)(
            f"request {subject}: {type(exc).__name__}") from None
    refused = (getattr(msg, "headers", None) or {}).get(NATS_ERROR_HEADER)
    if refused:
        raise CoreRequestError(f"request {subject}: core refused: {refused[:REFUSAL_MAX_CHARS]}")
    try:
        reply = json.loads(msg.data or b"null")
    except ValueError:
        raise CoreRequestError(f"request {subject}: reply is not JSON") from None
    if not isinstance(reply, dict):
        raise CoreRequestError(f"request {subject}: reply is not an object")
    return reply
