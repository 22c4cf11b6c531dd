"""The Cairn bridge process (``python -m bridges cairn``): connections, wiring, start and stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import nats
from nats.aio.msg import Msg

from bridges.cairn.admission import MessageKind, RedisRecall, Rules, job_kind
from bridges.cairn.consumers import JobConsumer, ensure_consumers, pool_consumers
from bridges.cairn.envelopes import Envelopes, LoopNats
from bridges.cairn.execution import Execution, SendJob, Shutdown, job_task_prefix
from bridges.cairn.holder import Holder
from bridges.cairn.pull import PullLoops
from bridges.cairn.record import BridgeRecord
from bridges.cairn.responders import PoolCalls, PoolSend, ResponderConfig, Responders
from bridges.cairn.results import TaskResults
from bridges.cairn.settle import FailureCounts
from workers.cairn.compat import IncompatibleCoreError, check_core_release
from workers.cairn.contract import subjects
from workers.cairn.nats_conn import NATS_UNAVAILABLE, connect_options, fault_recorder
from workers.cairn.outcomes import LEASE_NAMESPACE, AsyncOutcomeLedger
from workers.cairn.refusals import BRIDGE_ROLE, PermissionRefused, Refusals, fault_component
from workers.cairn.settings import CairnSettings
from workers.faults import clear_fault
from workers.lease import Leases
from workers.logs import redact
from workers.outage import Outage
from workers.providers.base import AUTH_OAUTH2, Provider
from workers.providers.registry import get_provider
from workers.redisconn import async_client, sync_client

log = logging.getLogger(__name__)

DRAIN_MARGIN_S = 3.0  # held messages get the shutdown grace plus this to settle before we close
EXIT_INCOMPATIBLE_CORE = 3
EXIT_LOOP_FAILED = 4
INITIAL_CONNECT_TIMEOUT_S = 30.0
EXIT_NATS_UNREACHABLE = 5
EXIT_PERMISSION_REFUSED = 6


Consumption = tuple[JobConsumer, MessageKind]  # a durable consumer and how admission reads its messages
# A plain request/reply subject the bridge answers itself (subject, queue group, request → reply body),
# e.g. the webhook verify handshake (bridges.cairn.webhooks): no pool call, no judgement.
Reply = tuple[str, str, Callable[[bytes], bytes]]


class NatsUnreachableError(Exception):
    """NATS did not answer at start; the message names the variable to check."""


@dataclass(frozen=True)
class TaskSenders:
    """How the bridge queues its pool's work (``tasks.cairn.PoolSenders``: the pool's own queue),
    injected by ``bridges.__main__``."""

    job: SendJob
    discover: PoolSend
    exchange: PoolSend


def links_oauth_accounts(provider: Provider) -> bool:
    return provider.manifest_meta() is not None and provider.auth_method() == AUTH_OAUTH2


class CairnBridge:
    """One bridge instance; ``await run()`` until ``stop()``.

    One asyncio loop owns every message it fetched (:class:`bridges.cairn.holder.Holder`), fetching
    only while fewer than ``CAIRN_MAX_IN_FLIGHT`` are held (:mod:`bridges.cairn.pull`). A Redis or
    NATS outage is ridden out, never a reason to exit (R1): each is reported to one
    :class:`workers.outage.Outage`, which logs its start and end once; held messages stay held. A
    subject NATS refuses (``Permissions Violation``) is no outage: reported once and recorded as a
    fault (:mod:`workers.cairn.refusals`); at start it stops the bridge with one line. What it needs
    from Celery is injected (:class:`TaskSenders`, the result backend): nothing here imports ``tasks``.

    It consumes the pool's job subjects (``pool_consumers``), each admitted by its
    ``job_kind``. Another consumer kind — webhook events on ``CAIRN_WEBHOOKS`` — is
    one more :data:`Consumption` in ``extra``: its durable consumer (with its own
    stream) and the :class:`MessageKind` admission reads it with. Same ack
    discipline, same single decision point, same ledger; the task side serves it
    through ``workers.cairn.handlers.HANDLERS[kind]``.
    """

    def __init__(self, settings: CairnSettings, senders: TaskSenders, backend: Any, *,
                 provider: Provider | None = None, extra: Sequence[Consumption] = (),
                 replies: Sequence[Reply] = ()) -> None:
        self.settings = settings
        self.senders, self.backend = senders, backend
        self.provider = provider or get_provider(settings.provider, settings)
        self.ack_wait_s = float(settings.ack_wait_s)
        parser_version = str(self.provider.parser_version)
        consumptions = [(c, job_kind(c.kind, parser_version)) for c in pool_consumers(settings, self.provider)]
        consumptions += list(extra)
        self.consumers = [c for c, _ in consumptions]
        self.kinds: dict[str, MessageKind] = {c.kind: kind for c, kind in consumptions}
        self.rules = Rules(settings.term_after_deliveries, settings.max_deliver)
        self.replies = list(replies)
        self._reply_subs: list[Any] = []
        self.shutdown = Shutdown()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.nc: nats.NATS | None = None
        self.failed = False
        self.pulls: PullLoops | None = None
        # R1: each outage is logged once, when it starts and when it ends (bridges.cairn.outage).
        self.redis_outage = Outage("Redis")
        self.nats_outage = Outage("NATS")
        self._closing = False  # our own drain disconnects: not an outage
        # Permissions Violations: permanent, reported once each, recorded as faults (workers.cairn.refusals).
        self.refusals = Refusals(fault_component(BRIDGE_ROLE, settings.worker_name),
                                 record=fault_recorder(settings))

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
        stop = asyncio.ensure_future(self.shutdown.event.wait())
        done, _ = await asyncio.wait({connect, stop}, timeout=INITIAL_CONNECT_TIMEOUT_S,
                                     return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if connect in done:
            return connect.result()
        connect.cancel()
        if self.shutdown.stopping:
            return None
        raise NatsUnreachableError(f"cannot reach CAIRN_NATS_URL within {INITIAL_CONNECT_TIMEOUT_S:.0f}s")

    def _wire(self, nc: nats.NATS) -> None:
        """Build the collaborators, each with only what it needs."""
        s = self.settings
        self.js = nc.jetstream()
        self._sync_redis = sync_client(s.redis_url)
        self._aredis = async_client(s.redis_url)
        leases = Leases(self._sync_redis, LEASE_NAMESPACE)
        self.failures = FailureCounts(self._aredis, redis_outage=self.redis_outage)
        self.ledger = AsyncOutcomeLedger(self._aredis)
        self.recall = RedisRecall(self._aredis, leases.key, redis_outage=self.redis_outage)
        self.results = TaskResults(self.backend, s.redis_url, redis_outage=self.redis_outage,
                                   covered=job_task_prefix(s.worker_name))
        self.execution = Execution(self.senders.job, self.results, leases, self._aredis,
                                   float(s.task_start_deadline_s), self.shutdown,
                                   redis_outage=self.redis_outage, lease_ttl_s=float(s.lease_ttl_s),
                                   pool=s.worker_name)
        self.envelopes = Envelopes(s, self.provider, LoopNats(asyncio.get_running_loop(), nc, self.js,
                                                              self.refusals))
        exchange = subjects.oauth_exchange_subject(s.provider, s.worker_name)
        config = ResponderConfig(subjects.discover_subject(s.provider, s.worker_name),
                                 exchange if links_oauth_accounts(self.provider) else None,
                                 s.worker_name,  # instances of one pool share requests
                                 float(s.discover_deadline_s), float(s.exchange_deadline_s))
        pool = PoolCalls(self.results, self.senders.discover, self.senders.exchange, s.worker_name)
        self.responders = Responders(nc, config, pool, self._sync_redis, self.spawn)
        self.record = BridgeRecord(self._aredis, pool=s.worker_name, provider=s.provider,
                                   durables=[c.durable for c in self.consumers], shutdown=self.shutdown,
                                   redis_outage=self.redis_outage, status=self._status)
        self.holder = Holder(kinds=self.kinds, rules=self.rules, recall=self.recall, runs=self.execution,
                             envelopes=self.envelopes, ledger=self.ledger, failures=self.failures,
                             shutdown=self.shutdown, slots=self._slots, spawn=self.spawn, ack_wait_s=self.ack_wait_s,
                             redis_outage=self.redis_outage, nats_outage=self.nats_outage)

    async def run(self) -> None:
        self._slots = asyncio.Semaphore(self.settings.max_in_flight)
        self.nc = await self._connect()
        if self.nc is None:
            return  # stopped before NATS answered
        self._wire(self.nc)
        try:
            await self.results.start()
            # Refused at start (the permissions lack a subject): stop with one line (main), never retry.
            await self.refusals.guard(check_core_release(self.js, self.settings.release), claim=True)
            await ensure_consumers(self.js, self.consumers, self.ack_wait_s, self.settings.max_deliver,
                                   self.refusals)
            await self.responders.start()
            await self._start_replies()
            await asyncio.to_thread(clear_fault, self._sync_redis, self.refusals.component)
            self.pulls = PullLoops(self.consumers, self._slots, self.shutdown, self.nats_outage, self.holder.take,
                                   tick_s=self.ack_wait_s / 3)
            self.pulls.start(self.js, self._loop_ended)
            record = asyncio.create_task(self.record.renew(), name="liveness")
            log.info("cairn bridge started: pool %s, %d job subjects, in-flight limit %d, AckWait %.1fs",
                     self.settings.worker_name, len(self.consumers),
                     self.settings.max_in_flight, self.ack_wait_s)
            await self.shutdown.event.wait()
            log.info("cairn bridge stopping: no more pulls; %d messages held", len(self.holder.held))
            await self.pulls.stop()
            record.cancel()
            await self.record.forget()
            await self._stop_replies()
            await self.responders.stop()
            await self._drain_held()
        finally:
            await self._close()
        log.info("cairn bridge stopped")

    async def _start_replies(self) -> None:
        assert self.nc is not None
        for subject, queue, answer in self.replies:
            async def respond(msg: Msg, answer: Callable[[bytes], bytes] = answer) -> None:
                if msg.reply:
                    await msg.respond(answer(msg.data))
            self._reply_subs.append(await self.nc.subscribe(subject, queue=queue, cb=respond))
            log.info("responder on %s (queue group %s)", subject, queue)

    async def _stop_replies(self) -> None:
        for sub in self._reply_subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._reply_subs.clear()

    async def _nats_error(self, exc: Exception) -> None:
        if self.refusals.note(exc):  # a Permissions Violation: permanent, reported once (not an outage)
            return
        if isinstance(exc, NATS_UNAVAILABLE) or self.nats_outage.down:
            self.nats_outage.failed("connection", exc)  # every failed reconnect attempt: logged once
        else:
            log.warning("NATS error: %s", redact(f"{type(exc).__name__}: {exc}"))

    async def _nats_disconnected(self) -> None:
        if self._closing:  # the drain in _close: a clean stop, not an outage
            return
        self.nats_outage.failed("disconnected; reconnecting")

    async def _nats_reconnected(self) -> None:
        self.refusals.clear()  # a new connection (a new JWT under auth-callout): permissions may differ
        if self.pulls is not None:
            self.pulls.resubscribe()  # pull subscriptions may not resume by themselves (nats.py#504)
        self.nats_outage.ok()
        log.info("NATS reconnected")

    def _loop_ended(self, task: asyncio.Task[Any]) -> None:
        """A pull loop that dies leaves its subject unconsumed: stop loudly, let the supervisor restart us."""
        if not task.cancelled() and task.exception() is not None and not self.shutdown.stopping:
            log.error("%s died (%s); stopping the bridge", task.get_name(), redact(repr(task.exception())))
            self.failed = True
            self.stop()

    def stop(self) -> None:
        """Stop pulling; held messages get ``CAIRN_SHUTDOWN_GRACE_S`` before they are NAKed."""
        self.shutdown.begin(self.settings.shutdown_grace_s)

    async def _drain_held(self) -> None:
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.settings.shutdown_grace_s + DRAIN_MARGIN_S)

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            await self.results.close()
        if self.nc is not None and not self.nc.is_closed:
            self._closing = True
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

    def _status(self) -> tuple[bool, list[str]]:
        """For the liveness record: NATS connected, and the durables whose last fetch answered."""
        connected = self.nc is not None and self.nc.is_connected and not self.nats_outage.down
        return connected, sorted(self.pulls.pulling) if self.pulls is not None else []


def main(settings: CairnSettings, provider: Provider, senders: TaskSenders, backend: Any,
         extra: Sequence[Consumption] = (), replies: Sequence[Reply] = ()) -> None:
    """Entry point of ``python -m bridges cairn`` (``bridges.__main__`` loads the pool's settings and
    provider and injects the Celery side and any consumer kind beyond the job subjects, ``extra``).

    A bad setting raises ConfigError (``bridges.__main__`` exits 2); an
    incompatible core exits ``EXIT_INCOMPATIBLE_CORE`` with the reason.
    """
    bridge = CairnBridge(settings, senders, backend, provider=provider, extra=extra, replies=replies)

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
    except PermissionRefused as exc:  # one line (the refusal was claimed, not logged): no traceback
        log.error("refusing to start: %s (core's worker template, contract §1); nothing was consumed, the pool's "
                  "jobs stay queued", exc)
        raise SystemExit(EXIT_PERMISSION_REFUSED) from None
