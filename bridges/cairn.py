"""The Cairn bridge: pull the pool's JetStream jobs and hand them to the provider pool.

``python -m bridges cairn``. One asyncio loop owns every NATS message it
fetched from arrival to disposition (contract §3 ack discipline, C1/C2):

* it fetches only while fewer than ``CAIRN_MAX_IN_FLIGHT`` messages are held;
* every held message gets ``in_progress`` every ``AckWait/3`` until it is
  acked, NAKed or termed, whatever it is waiting for;
* it decides on its own what needs no provider call: a poison payload, a job
  that already *failed* ``CAIRN_TERM_AFTER_DELIVERIES - 1`` times (counted in
  Redis, :mod:`bridges.cairn_ack`: rate-limit waits do not count) and the last
  delivery a finite ``CAIRN_MAX_DELIVER`` allows get a failure envelope and a
  Term; a ``parse_blob`` our parser cannot read is NAKed for a newer instance;
* everything else becomes one ``cairn.job`` Celery task on the ``provider``
  queue, carrying no secret; the task's returned disposition arrives through
  the Redis result backend's pub/sub (:mod:`bridges.cairn_results`);
* a lost task is noticed through its lease (``workers.lease``, namespace
  ``cairn``, key = stream sequence): granted by us before sending, taken and
  renewed by the task. A grant that is never taken within
  ``CAIRN_TASK_START_DEADLINE_S``, or a running lease that expires (worker
  SIGKILLed), is NAKed at once (after ``MIN_NAK_DELAY_S``) so JetStream redelivers.

Discover and OAuth exchange responders run here too (:mod:`bridges.cairn_responders`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
import uuid
from typing import Any

import nats
import redis
import redis.asyncio as aioredis
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from pydantic import ValidationError

from bridges import cairn_glue as glue
from bridges.cairn_ack import FailureCounts, Held, gives_up, settle
from bridges.cairn_pool import STREAM_JOBS, IncompatibleCoreError, JobConsumer, check_core_release, ensure_consumers
from bridges.cairn_responders import Responders
from bridges.cairn_results import TaskResults, TaskWatch
from bridges.cairn_webhooks import WebhookIntake
from workers.cairn.nats_conn import connect_options
from workers.cairn.settings import CairnSettings
from workers.lease import Leases, new_token
from workers.logs import redact

log = logging.getLogger(__name__)

FETCH_WAIT_S = 2.0  # short: a fetch holds an in-flight slot, and nats-py fetches can stall (ecosystem §2.1)
FETCH_ERROR_BACKOFF_S = 1.0
LEASE_CHECK_INTERVAL_S = 1.0  # how often a waiting message looks at its task's lease
LOST_TASK_GRACE_S = 3.0  # lease gone: the result may still be on its way (released just before return)
TASK_FAILURE_NAK_DELAY_S = 2.0  # a task that raised: redeliver soon, but not in a hot loop
LEASE_NAMESPACE = "cairn"
EXIT_INCOMPATIBLE_CORE = 3
EXIT_LOOP_FAILED = 4
INITIAL_CONNECT_TIMEOUT_S = 30.0
EXIT_NATS_UNREACHABLE = 5


class NatsUnreachableError(Exception):
    """NATS did not answer at start; the message names the variable to check."""


class CairnBridge:
    """One bridge instance; ``await run()`` until ``stop()``."""

    def __init__(self, settings: CairnSettings, *, app: Any = None, redis_url: str | None = None,
                 provider: Any = None) -> None:
        from tasks import app as default_app

        self.settings = settings
        self.app = app or default_app
        self.redis_url = redis_url or settings.redis_url
        self.provider = provider or glue.build_provider(settings)
        self.ack_wait_s = float(settings.ack_wait_s)
        self.start_deadline_s = float(settings.task_start_deadline_s)
        self.consumers = glue.pool_consumers(settings, self.provider)
        self._stopping = asyncio.Event()
        self._stop_deadline = float("inf")
        self._held: dict[int, Held] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.nc: nats.NATS | None = None
        self.failed = False
        self._resubscribe = False

    # ------------------------------------------------------------------ lifecycle
    async def _connect(self) -> nats.NATS | None:
        """The first connection: bounded, and abandoned at once on SIGTERM.

        nats-py retries forever with ``max_reconnect_attempts=-1`` (right once we
        are connected); at start an unreachable server must stop the process with
        a message naming the variable instead of hanging.
        """
        connect = asyncio.ensure_future(nats.connect(
            **connect_options(self.settings), error_cb=self._nats_error,
            disconnected_cb=self._nats_disconnected, reconnected_cb=self._nats_reconnected))
        stop = asyncio.ensure_future(self._stopping.wait())
        done, _ = await asyncio.wait({connect, stop}, timeout=INITIAL_CONNECT_TIMEOUT_S,
                                     return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if connect in done:
            return connect.result()
        connect.cancel()
        if self._stopping.is_set():
            return None
        raise NatsUnreachableError(f"cannot reach CAIRN_NATS_URL within {INITIAL_CONNECT_TIMEOUT_S:.0f}s")

    async def run(self) -> None:
        self._slots = asyncio.Semaphore(self.settings.max_in_flight)
        self.nc = await self._connect()
        if self.nc is None:
            return  # stopped before NATS answered
        self.js = self.nc.jetstream()
        self._sync_redis = redis.Redis.from_url(self.redis_url)
        self._aredis = aioredis.Redis.from_url(self.redis_url)
        self.leases = Leases(self._sync_redis, LEASE_NAMESPACE)
        self.failures = FailureCounts(self._aredis, STREAM_JOBS)
        self.sealed_store = glue.SealedStore(self._sync_redis)
        self.envelope_ctx = glue.envelope_context(self.settings, self.provider, asyncio.get_running_loop(),
                                                  self.nc, self.js)
        self.results = TaskResults(self.app, self.redis_url)
        try:
            await check_core_release(self.js, self.settings.release)
            await ensure_consumers(self.js, self.consumers, self.ack_wait_s, self.settings.max_deliver)
            self.responders = Responders(self, self.nc)
            await self.responders.start()
            self.webhooks = WebhookIntake(self)  # CAIRN_WEBHOOKS consumer + verify (bridges/cairn_webhooks.py)
            await self.webhooks.start()
            loops = [asyncio.create_task(self._pull_loop(c), name=f"pull-{c.kind}") for c in self.consumers]
            for loop_task in loops:
                loop_task.add_done_callback(self._loop_ended)
            log.info("cairn bridge started: pool %s, %d job subjects, in-flight limit %d, AckWait %.1fs",
                     self.settings.worker_name, len(self.consumers),
                     self.settings.max_in_flight, self.ack_wait_s)
            await self._stopping.wait()
            log.info("cairn bridge stopping: no more pulls; %d messages held", len(self._held))
            # A loop finishes its current fetch; one waiting for a free slot is cancelled.
            _, waiting = await asyncio.wait(loops, timeout=FETCH_WAIT_S + 1.0)
            for loop_task in waiting:
                loop_task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self.webhooks.stop()
            await self.responders.stop()
            await self._drain_held()
        finally:
            await self._close()
        log.info("cairn bridge stopped")

    async def _nats_error(self, exc: Exception) -> None:
        log.warning("NATS error: %s", redact(f"{type(exc).__name__}: {exc}"))

    async def _nats_disconnected(self) -> None:
        log.warning("NATS disconnected; reconnecting")

    async def _nats_reconnected(self) -> None:
        self._resubscribe = True  # pull subscriptions may not resume by themselves (nats.py#504)
        log.info("NATS reconnected")

    def _loop_ended(self, task: asyncio.Task[Any]) -> None:
        """A pull loop that dies leaves its subject unconsumed: stop loudly, let the supervisor restart us."""
        if not task.cancelled() and task.exception() is not None and not self._stopping.is_set():
            log.error("%s died (%s); stopping the bridge", task.get_name(), redact(repr(task.exception())))
            self.failed = True
            self.stop()

    def stop(self) -> None:
        """Stop pulling; held messages get ``CAIRN_SHUTDOWN_GRACE_S`` before they are NAKed."""
        if not self._stopping.is_set():
            self._stop_deadline = time.monotonic() + self.settings.shutdown_grace_s
            self._stopping.set()

    async def _drain_held(self) -> None:
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.settings.shutdown_grace_s + LEASE_CHECK_INTERVAL_S * 3)

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            await self.results.close()
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()
        with contextlib.suppress(Exception):
            await self._aredis.aclose()
        self._sync_redis.close()

    def spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ pulling
    async def _pull_loop(self, consumer: JobConsumer) -> None:
        sub = await self.js.pull_subscribe_bind(durable=consumer.durable, stream=STREAM_JOBS)
        try:
            while not self._stopping.is_set():
                if self._resubscribe or sub is None:
                    sub = await self._rebind(consumer, sub)
                    if sub is None:
                        await asyncio.sleep(FETCH_ERROR_BACKOFF_S)
                        continue
                await self._slots.acquire()
                if self._stopping.is_set():
                    self._slots.release()
                    break
                try:
                    msgs = await sub.fetch(1, timeout=FETCH_WAIT_S)
                except (NatsTimeoutError, asyncio.TimeoutError):
                    self._slots.release()
                    continue
                except Exception as exc:  # noqa: BLE001 - log, back off, bind again, fetch again
                    self._slots.release()
                    log.warning("fetch on %s failed: %s", consumer.subject, redact(str(exc)))
                    await asyncio.sleep(FETCH_ERROR_BACKOFF_S)
                    sub = await self._rebind(consumer, sub)
                    continue
                for i, msg in enumerate(msgs):
                    if i:  # fetch(1) returns one; stay correct if it ever returns more
                        await self._slots.acquire()
                    self.spawn(self._own(consumer, msg), name=f"held-{consumer.kind}")
        finally:
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _rebind(self, consumer: JobConsumer, sub: Any) -> Any:
        """A fresh pull subscription on the shared durable, or None if it cannot be bound now."""
        self._resubscribe = False
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        try:
            return await self.js.pull_subscribe_bind(durable=consumer.durable, stream=STREAM_JOBS)
        except Exception as exc:  # noqa: BLE001 - e.g. the durable was deleted: keep trying, loudly
            log.error("cannot bind %s on %s: %s", consumer.durable, consumer.subject, type(exc).__name__)
            return None

    async def _own(self, consumer: JobConsumer, msg: Msg) -> None:
        meta = msg.metadata
        held = Held(consumer, msg, int(meta.num_delivered), int(meta.sequence.stream))
        self._held[held.seq] = held
        ticker = asyncio.create_task(self._keep_alive(held))
        try:
            if self._stopping.is_set():
                await self._settle(held, glue.nak("bridge shutting down", failure=False))
                return
            disposition = await self._decide(held)
            await self._settle(held, disposition)
        except Exception as exc:  # noqa: BLE001 - never leave a message without disposition
            log.exception("job seq %d failed in the bridge: %s", held.seq, redact(str(exc)))
            await self._settle(held, glue.nak("bridge error", failure=False, delay_s=TASK_FAILURE_NAK_DELAY_S))
        finally:
            ticker.cancel()
            self._held.pop(held.seq, None)
            self._slots.release()

    async def _keep_alive(self, held: Held) -> None:
        """C1: in_progress from arrival until disposition, below AckWait."""
        interval = self.ack_wait_s / 3
        while not held.settled:
            await asyncio.sleep(interval)
            if held.settled:
                return
            try:
                await held.msg.in_progress()
            except Exception as exc:  # noqa: BLE001 - keep trying; a lost tick is not fatal
                log.warning("in_progress for seq %d failed: %s", held.seq, type(exc).__name__)

    async def _settle(self, held: Held, disposition: Any) -> None:
        await settle(held, disposition, self.failures, self.settings.term_after_deliveries)

    # ------------------------------------------------------------------ deciding
    async def _decide(self, held: Held) -> Any:
        kind = held.consumer.kind
        raw: Any = None
        try:
            raw = json.loads(held.msg.data)
            if not isinstance(raw, dict):
                raise ValueError("job payload is not a JSON object")
            job = glue.parse_job(kind, raw)
        except (ValueError, TypeError, ValidationError) as exc:
            reason = f"poison {kind} payload: {glue.describe_invalid(exc)}"
            return await glue.terminate(self, held, raw if isinstance(raw, dict) else {}, code="bad_payload",
                                        message=reason, error_class="ERROR_CLASS_INVALID_INPUT")
        held.failures = await self.failures.count(held)  # read first: a term below also clears it
        max_deliver = self.settings.max_deliver
        if 0 < max_deliver <= held.delivery:  # JetStream would drop a NAK of its last delivery silently (C2)
            reason = f"delivery {held.delivery} is the last CAIRN_MAX_DELIVER allows; giving up"
            return await glue.terminate(self, held, raw, code="max_deliveries", message=reason,
                                        error_class="ERROR_CLASS_TRANSIENT")
        if kind == glue.PARSE_BLOB:
            refusal = glue.parse_blob_refusal(self.provider, job)
            if refusal:  # left for a newer instance: not a failure of the job
                return glue.nak(refusal, failure=False, delay_s=glue.PARSER_REFUSED_NAK_DELAY_S)
        if gives_up(held.failures, self.settings.term_after_deliveries):
            reason = f"failed on {held.failures} of {held.delivery} deliveries; giving up"
            return await glue.terminate(self, held, raw, code="max_deliveries", message=reason,
                                        error_class="ERROR_CLASS_TRANSIENT")
        return await self._run_task(held, raw)

    async def _run_task(self, held: Held, payload: dict[str, Any]) -> Any:
        held.token = new_token()
        task_id = f"cairn-{held.seq}-d{held.delivery}-{uuid.uuid4().hex[:8]}"
        meta = {"delivery": held.delivery, "seq": held.seq, "lease_token": held.token,
                "subject": held.msg.subject}
        watch = await self.results.watch(task_id)
        try:
            await asyncio.to_thread(self._grant_and_send, held, payload, meta, task_id)
            return await self._await_disposition(held, watch)
        finally:
            await self.results.forget(watch)

    def _grant_and_send(self, held: Held, payload: dict[str, Any], meta: dict[str, Any], task_id: str) -> None:
        """Grant the lease, then queue the task that carries its token (one worker-thread hop:
        both are blocking client calls, and this runs for every message)."""
        from tasks.cairn import send_job

        self.leases.grant(str(held.seq), str(held.token), self.start_deadline_s)
        send_job(self.app, held.consumer.kind, payload, meta, task_id)

    async def _await_disposition(self, held: Held, watch: TaskWatch) -> Any:
        lease_key = self.leases.key(str(held.seq))
        granted = f"granted:{held.token}"
        while True:
            done, _ = await asyncio.wait({watch.done}, timeout=LEASE_CHECK_INTERVAL_S)
            if done:
                return glue.disposition_from_meta(watch.done.result(), TASK_FAILURE_NAK_DELAY_S)
            raw = await self._aredis.get(lease_key)
            holder = raw.decode() if isinstance(raw, bytes) else raw
            if holder and holder.startswith(f"running:{held.token}:"):
                held.running = True
            elif holder == granted:
                if self._stopping.is_set() or time.monotonic() - held.arrived > self.start_deadline_s:
                    if await asyncio.to_thread(self.leases.release, str(held.seq), granted):
                        why = "shutting down" if self._stopping.is_set() else "task not started in time"
                        return glue.nak(f"{why}; revoked the queued task", failure=False)
                    continue  # it was taken just now
            else:
                # Grant expired unstarted, or the running lease expired: the task is lost,
                # unless its result is on the way (the task releases just before returning).
                done, _ = await asyncio.wait({watch.done}, timeout=LOST_TASK_GRACE_S)
                if done:
                    return glue.disposition_from_meta(watch.done.result(), TASK_FAILURE_NAK_DELAY_S)
                # A task lost mid-run failed (a job that kills its worker every time must end
                # in a term); one that never started did not.
                why = "lease expired: task lost" if held.running else "task never started"
                return glue.nak(why, failure=held.running)
            if self._stopping.is_set() and time.monotonic() > self._stop_deadline:
                return glue.nak("shutdown grace over; handing the job to another instance", failure=False)


def main() -> None:
    """Entry point of ``python -m bridges cairn``.

    A bad setting raises ConfigError (``bridges.__main__`` exits 2); an
    incompatible core exits ``EXIT_INCOMPATIBLE_CORE`` with the reason.
    """
    from workers.cairn.settings import load_cairn_settings

    settings = load_cairn_settings()
    bridge = CairnBridge(settings)

    async def _run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, bridge.stop)
        await bridge.run()

    try:
        asyncio.run(_run())
        if bridge.failed:
            raise SystemExit(EXIT_LOOP_FAILED)
    except NatsUnreachableError as exc:
        print(f"switchyard cairn bridge: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_NATS_UNREACHABLE) from None
    except IncompatibleCoreError as exc:
        log.error("refusing to start: %s", exc)
        print(f"switchyard cairn bridge: refusing to start: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_INCOMPATIBLE_CORE) from None
