"""``DevCairnCore``: the core side of the Cairn contract on a background loop thread.

Tests and the demo are synchronous, nats-py is asyncio: the core owns one
event loop in a daemon thread and every public method is a thread-safe call
into it. It bootstraps streams/KV like core, answers the request/reply
subjects, ingests results strictly, publishes jobs, and exposes what it saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import uuid
from collections.abc import Coroutine
from datetime import datetime, timedelta
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext

from devstack.fakes.cairn_core import bootstrap as bs
from devstack.fakes.cairn_core import subjects as subj
from devstack.fakes.cairn_core.accounts import Account, AccountRegistry, utcnow
from devstack.fakes.cairn_core.blobs import BlobStore
from devstack.fakes.cairn_core.responders import Responders, parse_rfc3339, rfc3339
from devstack.fakes.cairn_core.router import DeadLetter, IngestedResult, Rejection, ResultRouter
from devstack.fakes.cairn_core.scheduler import (
    POLLING_INTERVAL_S,
    SCHEDULER_TICK_S,
    JobPublisher,
    PublishedJob,
)
from devstack.fakes.cairn_core.views import CALL_TIMEOUT_S, JetStreamView
from devstack.fakes.cairn_core.webhooks import WebhookHttp, forward_event, relay_verify

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
ROUTER_FETCH_BATCH = 16
ROUTER_FETCH_TIMEOUT_S = 1.0
FETCH_RETRY_S = 0.5  # backoff after a failed fetch (no event to await)
DISCOVER_TIMEOUT_S = 90.0
OAUTH_EXCHANGE_TIMEOUT_S = 20.0
WEBHOOK_VERIFY_TIMEOUT_S = 3.0
DEFAULT_BUCKET = "cairn"


class DevCairnCore(JetStreamView):
    """Dev Cairn core. ``start()`` returns once everything core creates exists."""

    def __init__(self, nats_url: str, s3_endpoint: str, bucket: str = DEFAULT_BUCKET, *,
                 release: str = bs.DEFAULT_RELEASE, info: dict[str, Any] | None = None,
                 faithful_webhooks: bool = False, polling_interval_s: float = POLLING_INTERVAL_S,
                 nats_login: dict[str, str] | None = None) -> None:
        self.nats_url = nats_url
        self.nats_login = dict(nats_login or {})  # {"user", "password"}: the dev server's ``core`` user
        self.info = {"release": release} | (info or {})
        self.faithful_webhooks = faithful_webhooks
        self.polling_interval_s = polling_interval_s
        self.accounts = AccountRegistry()
        self.blobs = BlobStore(s3_endpoint, bucket)
        self.router = ResultRouter(self.accounts, self.blobs, subj.decode_job_result)
        self.responders = Responders(self.accounts, self.blobs, self._publish_reauth)
        self.reauth_events: list[dict[str, Any]] = []
        self.dead_letters: list[DeadLetter] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._jobs: JobPublisher | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._scheduler: asyncio.Task[None] | None = None
        self.clock = utcnow  # received-at of forwarded webhooks (tests pin it: core's msg id has 1 s resolution)
        self.webhooks_http: WebhookHttp | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> DevCairnCore:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dev-cairn-core", daemon=True)
        self._thread.start()
        try:
            self._call(self._astart(), START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.webhooks_http is not None:
            self.webhooks_http.stop()
            self.webhooks_http = None
        if self._loop is None:
            return
        with contextlib.suppress(Exception):
            self._call(self._astop(), CALL_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(CALL_TIMEOUT_S)
        self._loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> DevCairnCore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _astart(self) -> None:
        self._nc = await nats.connect(self.nats_url, name="cairn-core-dev", max_reconnect_attempts=-1,
                                      **self.nats_login)
        self._js = self._nc.jetstream()
        await asyncio.to_thread(self.blobs.ensure_bucket)
        await bs.bootstrap(self._js, self.info, faithful_webhooks=self.faithful_webhooks)
        await self._js.add_consumer(bs.STREAM_RESULTS, bs.ingest_router_config(subj.RESULTS_ALL))
        await self._js.add_consumer(bs.STREAM_EVENTS, bs.reauth_notifier_config())
        self._jobs = JobPublisher(self._js, self.router, subj.job_subject)
        r, nc = self.responders, self._nc
        for subject, cb in ((subj.TOKENS_ALL, r.tokens), (subj.CREDS_GET_ALL, r.creds),
                            (subj.PRESIGN_UPLOAD_ALL, r.presign_upload),
                            (subj.PRESIGN_DOWNLOAD_ALL, r.presign_download),
                            (subj.ACCOUNT_LOOKUP_ALL, r.lookup), (bs.MAX_DELIVERIES_ADVISORY, self._advisory)):
            await nc.subscribe(subject, cb=cb)
        await nc.flush()
        router_sub = await self._js.pull_subscribe_bind(durable=bs.INGEST_ROUTER_DURABLE, stream=bs.STREAM_RESULTS)
        reauth_sub = await self._js.pull_subscribe_bind(durable=bs.REAUTH_NOTIFIER_DURABLE, stream=bs.STREAM_EVENTS)
        self._tasks = [asyncio.create_task(self._route_loop(router_sub)),
                       asyncio.create_task(self._reauth_loop(reauth_sub))]

    async def _astop(self) -> None:
        for task in [*self._tasks, *([self._scheduler] if self._scheduler else [])]:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks, self._scheduler = [], None
        if self._nc is not None:
            # close, not drain: a drain waits out pending pull requests (drain_timeout 30 s)
            with contextlib.suppress(Exception):
                await self._nc.close()
            self._nc = None
        current = asyncio.current_task()
        leftovers = [t for t in asyncio.all_tasks() if t is not current]
        for task in leftovers:
            task.cancel()
        await asyncio.gather(*leftovers, return_exceptions=True)

    # ---- loops (loop thread) ---------------------------------------------------------------
    @staticmethod
    async def _messages(sub: JetStreamContext.PullSubscription) -> Any:
        """Every message of a pull subscription, forever; timeouts and reconnects are retried."""
        while True:
            try:
                msgs = await sub.fetch(ROUTER_FETCH_BATCH, timeout=ROUTER_FETCH_TIMEOUT_S)
            except (TimeoutError, NatsTimeoutError):
                continue
            except Exception:  # noqa: BLE001 - e.g. a reconnect; back off, keep consuming
                log.warning("fetch failed; retrying", exc_info=True)
                await asyncio.sleep(FETCH_RETRY_S)
                continue
            for msg in msgs:
                yield msg

    async def _route_loop(self, sub: JetStreamContext.PullSubscription) -> None:
        async for msg in self._messages(sub):
            msg_id = (msg.headers or {}).get("Nats-Msg-Id")
            try:
                ok = await self.router.handle(msg.subject, msg.data, msg_id)
            except Exception:  # noqa: BLE001 - a router bug must not stop ingestion
                log.exception("result router failed on %s; nak", msg.subject)
                await msg.nak()
                continue
            await (msg.ack() if ok else msg.term())

    async def _reauth_loop(self, sub: JetStreamContext.PullSubscription) -> None:
        async for msg in self._messages(sub):
            with contextlib.suppress(ValueError):
                self.reauth_events.append(json.loads(msg.data))
            await msg.ack()

    async def _advisory(self, msg: Msg) -> None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            body = json.loads(msg.data)
            self.dead_letters.append(DeadLetter(body["stream"], body["consumer"], int(body["stream_seq"]),
                                                int(body["deliveries"])))

    async def _publish_reauth(self, acct: Account, reason: str) -> None:
        body = {"account_id": acct.account_id, "reason": reason, "at": rfc3339(utcnow())}
        await self.js.publish(bs.NEEDS_REAUTH_EVENT_SUBJECT, json.dumps(body).encode(),
                              headers={"Nats-Msg-Id": f"reauth:{acct.account_id}"})

    async def _scheduler_loop(self, interval_s: float) -> None:
        assert self._jobs is not None
        while True:
            for acct in self.accounts.all():
                try:
                    if await self._jobs.due(acct, self.polling_interval_s):
                        await self._jobs.schedule_reconcile(acct, reason="scheduled")
                except Exception:  # noqa: BLE001 - one account must not stop the tick
                    log.exception("reconcile scheduling failed for %s", acct.account_id)
            await asyncio.sleep(interval_s)  # the scheduler's tick, not a wait for an event

    # ---- what tests read -------------------------------------------------------------------
    @property
    def ingested(self) -> list[IngestedResult]:
        with self.router.cond:
            return list(self.router.ingested)

    @property
    def rejected(self) -> list[Rejection]:
        with self.router.cond:
            return list(self.router.rejected)

    @property
    def published_jobs(self) -> list[PublishedJob]:
        return list(self._jobs.published) if self._jobs else []

    def wait_for_ingested(self, n: int, timeout_s: float = 10.0) -> list[IngestedResult]:
        """Block until at least ``n`` results were accepted (condition variable, no sleeps)."""
        self.router.wait(lambda: len(self.router.ingested) >= n, timeout_s, f"{n} ingested results")
        return self.ingested

    def wait_for_rejected(self, n: int, timeout_s: float = 10.0) -> list[Rejection]:
        self.router.wait(lambda: len(self.router.rejected) >= n, timeout_s, f"{n} rejected results")
        return self.rejected

    def wait_for_results(self, n: int, timeout_s: float = 10.0) -> None:
        """Until ``n`` results were decided either way."""
        self.router.wait(lambda: len(self.router.ingested) + len(self.router.rejected) >= n, timeout_s,
                         f"{n} decided results")

    def set_release(self, release: str, **extra: Any) -> None:
        """Rewrite ``cairn_core``/``info`` (e.g. to test a worker refusing an incompatible core)."""
        self.info = {"release": release} | extra
        self.kv_put(bs.KV_CORE, bs.KV_CORE_INFO_KEY, self.info)

    # ---- accounts --------------------------------------------------------------------------
    def connect_account(self, provider: str, account_id: str | None, access_token: str | None,
                        refresh_token: str | None, expires_at: datetime | float | int | None, *,
                        user_id: str | None = None, worker_name: str | None = None,
                        external_id: str | int | None = None, client_id: str = "", client_secret: str = "",
                        scope: str = "read,activity:read_all", subscription_id: str | None = None,
                        auto_import: bool = True) -> Account:
        """Register a connection (tokens in memory only). ``expires_at``: datetime or unix s."""
        if isinstance(expires_at, (int, float)):
            expires_at = datetime.fromtimestamp(expires_at, tz=utcnow().tzinfo)
        return self.accounts.add(Account(
            provider=provider, account_id=account_id or str(uuid.uuid4()), user_id=user_id or str(uuid.uuid4()),
            access_token=access_token, refresh_token=refresh_token, expires_at=expires_at,
            worker_name=worker_name, external_id=str(external_id) if external_id is not None else None,
            subscription_id=subscription_id, client_id=client_id, client_secret=client_secret, scope=scope,
            auto_import=auto_import))

    def account(self, account_id: str) -> Account:
        acct = self.accounts.get(account_id)
        if acct is None:
            raise KeyError(account_id)
        return acct

    def inject_fault(self, responder: str, reply: dict[str, Any] | None = None, *, drop: bool = False,
                     times: int = 1) -> None:
        """Next ``times`` requests to ``responder`` get ``reply`` (or no reply with ``drop``)."""
        self.responders.inject(responder, reply, drop=drop, times=times)

    # ---- jobs ------------------------------------------------------------------------------
    def enqueue_job(self, kind: str, payload: dict[str, Any], msg_id: str | None = None, *,
                    provider: str | None = None, worker_name: str | None = None) -> PublishedJob:
        """Publish any job kind on its pool subject; provider/pool default from the payload's account."""
        acct = self.accounts.get(str(payload.get("account_id", "")))
        provider = provider or payload.get("provider") or (acct.provider if acct else None)
        worker_name = worker_name or (acct.worker_name if acct else None)
        if not provider or not worker_name:
            raise ValueError("enqueue_job needs a provider and a pool (worker_name) or a known account_id")
        assert self._jobs is not None, "not started"
        return self._call(self._jobs.enqueue(kind, payload, msg_id, provider=provider, worker_name=worker_name))

    def pool_capabilities(self, provider: str, worker_name: str) -> set[str]:
        """What the scheduler sees a pool declare (its manifest, while a worker is live): import_gear's gate."""
        assert self._jobs is not None, "not started"
        return self._call(self._jobs.pool_capabilities(provider, worker_name))

    def schedule_reconcile(self, account_id: str, *, reason: str = "manual", force: bool = False,
                           webhook_seen: bool = False) -> list[PublishedJob]:
        """What the scheduler does for one account; [] when the budget gate skips it."""
        assert self._jobs is not None, "not started"
        acct = self.account(account_id)
        return self._call(self._jobs.schedule_reconcile(acct, reason=reason, force=force,
                                                        webhook_seen=webhook_seen))

    def start_scheduler(self, interval_s: float = SCHEDULER_TICK_S) -> None:
        """Periodic reconcile loop (first tick immediately), like core's scheduler."""
        async def run() -> None:
            if self._scheduler is None:
                self._scheduler = asyncio.create_task(self._scheduler_loop(interval_s))
        self._call(run())

    def stop_scheduler(self) -> None:
        async def run() -> None:
            if self._scheduler is not None:
                self._scheduler.cancel()
                self._scheduler = None
        self._call(run())

    # ---- core as requester -----------------------------------------------------------------
    def request(self, subject: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        async def run() -> dict[str, Any]:
            assert self._nc is not None
            reply = await self._nc.request(subject, json.dumps(body).encode(), timeout=timeout_s)
            return json.loads(reply.data)
        return self._call(run(), timeout_s + CALL_TIMEOUT_S)

    def discover(self, account_id: str, start_page: int = 1,
                 timeout_s: float = DISCOVER_TIMEOUT_S) -> dict[str, Any]:
        acct = self.account(account_id)
        return self.request(subj.discover_subject(acct.provider, acct.worker_name or ""),
                            {"account_id": account_id, "start_page": start_page}, timeout_s)

    def oauth_exchange(self, provider: str, worker_name: str, code: str, client_id: str, client_secret: str,
                       redirect_uri: str, *, user_id: str | None = None, code_verifier: str | None = None,
                       timeout_s: float = OAUTH_EXCHANGE_TIMEOUT_S) -> Account:
        """Ask the pool to exchange ``code`` (§9b) and store the reply as a new connection."""
        body = {"connection_id": str(uuid.uuid4()), "client_id": client_id, "client_secret": client_secret,
                "code": code, "redirect_uri": redirect_uri}
        if code_verifier:
            body["code_verifier"] = code_verifier
        reply = self.request(subj.oauth_exchange_subject(provider, worker_name), body, timeout_s)
        if reply.get("error") or not reply.get("access_token"):
            raise RuntimeError(f"oauth exchange failed: {reply.get('error', 'no access_token')}")
        return self.connect_account(
            provider, None, reply["access_token"], reply.get("refresh_token"),
            parse_rfc3339(reply.get("expires_at")) or utcnow() + timedelta(hours=6), user_id=user_id,
            worker_name=worker_name, external_id=reply.get("provider_account_id"), client_id=client_id,
            client_secret=client_secret, scope=reply.get("scope") or "read,activity:read_all")

    def start_webhooks_http(self, port: int = 0) -> WebhookHttp:
        """Serve ``POST``/``GET /webhooks/<key>`` on 127.0.0.1 (reference §2.13); the running server."""
        if self.webhooks_http is None:
            def run(coro: Coroutine[Any, Any, Any]) -> Any:
                assert self._loop is not None, "not started"
                return asyncio.run_coroutine_threadsafe(coro, self._loop)
            self.webhooks_http = WebhookHttp(run, lambda: self.js, lambda: self._nc,
                                             lambda: self.clock()).start(port)
        return self.webhooks_http

    def webhook_url(self, worker_key: str) -> str:
        """The callback URL a provider subscription names (starts the HTTP endpoint if needed)."""
        return self.start_webhooks_http().url(worker_key)

    def forward_webhook(self, worker_key: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        """``POST /webhooks/<worker_key>`` as core forwards it (§2.13), without the HTTP hop."""
        self._call(forward_event(self.js, worker_key, body, headers or {}, "127.0.0.1", self.clock()))

    def verify_webhook(self, worker_key: str, query: dict[str, str]) -> dict[str, Any]:
        """The raw verify reply (``{status, content_type, body}``) to a relayed handshake."""
        return self.request(subj.webhook_verify_subject(worker_key), {"method": "GET", "query": query},
                            WEBHOOK_VERIFY_TIMEOUT_S)

    def relay_verify(self, worker_key: str, query: dict[str, str]) -> tuple[int, str, bytes]:
        """What core answers Strava's GET: (status, content type, body); raises when nobody answers."""
        return self._call(relay_verify(self._nc, worker_key, query, WEBHOOK_VERIFY_TIMEOUT_S))
