"""Handler-level Cairn test kit: a real ``JobContext`` against the dev core and fake Strava.

Nothing of ours is mocked: a ``JobContext`` here has a real NATS thread
(nats-server with JetStream), the shared KV rate limiter, Redis, the
claim-check (presign → moto S3 PUT → publish) and the Strava provider. Core
and Strava are the dev doubles (deploy/devstack). Test modules import the
fixtures by name (``tests/conftest.py`` registers this module as a plugin) and
may define their own ``strava`` (e.g. one behind a gate) instead of this one.

A job runs through :func:`admit_and_run`: the bridge's own admission
(``bridges.cairn.admission.admit``, the one decision point) judges the payload
and the task side's ``run_admitted`` runs what it admits, in this process,
without Celery and the lease (the e2e tests cover those).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import nats
import pytest
import redis
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from bridges.cairn.admission import DeliveryMeta, Dispatch, History, Rules, Settle, admit, job_kind
from bridges.cairn.consumers import pool_consumers
from devstack.fakes.cairn_core import DevCairnCore, bootstrap
from devstack.fakes.strava import FakeStrava
from devstack.infra import services
from workers.cairn.contract import subjects
from workers.cairn.contract.subjects import RATE_LIMIT_BUCKET
from workers.cairn.disposition import ENVELOPE_FAILED_NAK_DELAY_S, Disposition, nak
from workers.cairn.handlers import Delivery, JobContext, run_admitted
from workers.cairn.handlers.failure import publish_failure
from workers.cairn.nats_conn import NatsThread
from workers.cairn.ratelimit import RateLimiter
from workers.cairn.settings import CairnSettings
from workers.providers.errors import ProviderRateLimited
from workers.providers.models import PoolIdentity
from workers.providers.strava.provider import StravaProvider
from workers.providers.strava.settings import StravaSettings
from workers.providers.strava.usage import RESET_GRACE_S, next_short_reset
from workers.providers.windows import WindowUsage

PACKAGE = "switchyard.providers.strava"
PROVIDER = "strava"
INGEST_TIMEOUT_S = 15.0


@contextlib.contextmanager
def job_context(nats_url: str, redis_url: str, strava: FakeStrava, pool: str, *,
                fresh_budget: bool = True, **settings: Any) -> Iterator[JobContext]:
    """One pool instance's context (what ``build_context`` makes in a worker process), logged in
    as the pool's worker user on a dev nats-server: core's permission template (contract §1)."""
    server = services.started_nats(nats_url)
    if server is not None:
        login = services.nats_login(server, PROVIDER, pool)
        settings = {"nats_user": login.user, "nats_password": login.password} | settings
    cairn = CairnSettings(nats_url=nats_url, provider=PROVIDER, worker_name=pool, worker_package=PACKAGE,
                          **settings)
    nt = NatsThread(cairn)
    provider = StravaProvider(StravaSettings(base_url=strava.base_url), pool=PoolIdentity(pool, PACKAGE))
    limiter = RateLimiter(nt, cairn, provider.rate_windows())
    limiter._bucket()  # open the KV bucket off the loop thread (see context._build)
    if fresh_budget:
        forget_budget(nt)  # a fresh shared budget (a 429 test exhausts it)
    client = redis.Redis.from_url(redis_url)
    context = JobContext(settings=cairn, nats=nt, redis=client, provider=provider,
                         http=provider.new_http_client(), limiter=limiter)
    try:
        yield context
    finally:
        context.http.close()
        context.claimcheck.http.close()
        client.close()
        nt.close()


async def core_bucket(js: JetStreamContext, name: str) -> KeyValue:
    """Core's KV bucket ``name``, created as core creates it (``bootstrap.create_bucket``) if missing.

    Never ``js.create_key_value`` with nats-py's defaults: without direct get a worker's read goes to
    ``STREAM.MSG.GET``, which core's worker template refuses, so the test would run a read path
    production never takes, and on a session nats-server every later test would inherit the bucket
    (tests/meta/test_suite_rules.py).
    """
    await bootstrap.create_bucket(js, next(spec for spec in bootstrap.BUCKETS if spec.name == name))
    return await js.key_value(name)


_seqs = itertools.count(1_000_000)  # stream positions of deliveries no stream holds (see admit_and_run)


async def _no_history(meta: DeliveryMeta) -> History:
    return History()  # nothing ran before this delivery: the handler is what these tests look at


def admit_and_run(ctx: JobContext, kind: str, payload: Any, delivery: Delivery | int = 1) -> Disposition:
    """One delivery of ``payload`` on the pool's ``kind`` subject, judged and run as the fleet does it.

    The bytes go through ``admit`` with the pool's own consumer kinds (what the
    bridge builds from the provider's declared capabilities) and rules; a
    ``Settle`` that carries an envelope publishes it with the envelope code the
    bridge uses (``publish_failure``), a ``Dispatch`` runs the admitted job with
    ``run_admitted`` as the pool task does. No history: the message never ran.
    """
    run = Delivery.coerce(delivery)
    settings, provider = ctx.settings, ctx.provider
    kinds = {c.kind: job_kind(c.kind, str(provider.parser_version)) for c in pool_consumers(settings, provider)}
    meta = DeliveryMeta(kind=kind, stream=subjects.JOBS_STREAM, seq=run.stream_seq or next(_seqs), stamp=time.time(),
                        delivered=run.attempt, subject=subjects.job_subject(kind, ctx.provider_name, ctx.worker_name))
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    verdict = asyncio.run(admit(raw, meta, kinds=kinds, recall=_no_history,
                                rules=Rules(settings.term_after_deliveries, settings.max_deliver)))
    if isinstance(verdict, Dispatch):
        return run_admitted(ctx, kind, verdict.job, Delivery(run.attempt, meta.seq, meta.subject, run.lost))
    assert isinstance(verdict, Settle), verdict  # no history: nothing to adopt
    envelope = verdict.envelope
    if envelope is not None:
        try:
            publish_failure(ctx, kind, envelope.ref, Delivery(run.attempt, meta.seq, meta.subject), code=envelope.code,
                            message=envelope.message, error_class=envelope.error_class)
        except Exception:  # noqa: BLE001 - as the bridge: no envelope, no term
            return nak(ENVELOPE_FAILED_NAK_DELAY_S, reason=f"failure envelope not published: {envelope.code}")
    return verdict.disposition


def forget_budget(nt: NatsThread, kv: Any = None) -> None:
    """Empty the shared budget as core (or an operator) would: listing the bucket's keys is no
    pool's permission, so on a connection of core's (anonymous on the dev server), not ``nt``'s."""
    async def purge() -> None:
        nc = await nats.connect(nt.settings.nats_url)
        try:
            bucket = await nc.jetstream().key_value(RATE_LIMIT_BUCKET)
            try:
                keys = await bucket.keys()
            except Exception:  # noqa: BLE001 - nats NoKeysError: nothing stored yet
                return
            for key in keys:
                await bucket.purge(key)
        finally:
            await nc.close()

    asyncio.run(purge())


class Athlete:
    """A fake-Strava athlete connected to core on ``pool``, with helpers for its jobs."""

    def __init__(self, core: DevCairnCore, strava: FakeStrava, pool: str, n: int = 6) -> None:
        self.id = int(uuid.uuid4().int % 9000) + 1000
        self.fake = strava.add_athlete(self.id, n_activities=n)
        self.user_id = str(uuid.uuid4())
        self.acct = core.connect_account(PROVIDER, None, self.fake.access_token, self.fake.refresh_token,
                                         self.fake.expires_at, user_id=self.user_id, worker_name=pool,
                                         external_id=self.id, client_id=strava.client_id,
                                         client_secret=strava.client_secret)
        self.account_id = self.acct.account_id

    def ext(self, i: int) -> str:
        return str(self.id * 100_000 + i + 1)

    def fetch_job(self, i: int = 0, **extra: Any) -> dict[str, Any]:
        return {"job_id": str(uuid.uuid4()), "account_id": self.account_id, "user_id": self.user_id,
                "provider": PROVIDER, "ext_id": self.ext(i), "fetch_streams": True, "reason": "queue", **extra}


def is_segment_result(record: Any) -> bool:
    """The second fetch_source/parse_blob result (``…:seg``), which follows an activity's."""
    return (record.msg_id or "").endswith(":seg")


def ingested_since(core: DevCairnCore, before: int, n: int = 1) -> list[Any]:
    """At least ``n`` results accepted since ``before``, segment results left out (see ``segments_since``)."""
    mine = lambda: [r for r in core.router.ingested[before:] if not is_segment_result(r)]  # noqa: E731
    core.router.wait(lambda: len(mine()) >= n, INGEST_TIMEOUT_S, f"{n} results")
    return mine()


def segments_since(core: DevCairnCore, before: int, n: int = 1) -> list[Any]:
    """At least ``n`` segment results accepted since ``before``."""
    mine = lambda: [r for r in core.router.ingested[before:] if is_segment_result(r)]  # noqa: E731
    core.router.wait(lambda: len(mine()) >= n, INGEST_TIMEOUT_S, f"{n} segment results")
    return mine()


def assert_json_and_secret_free(value: Any, *secrets: str) -> None:
    text = json.dumps(value)
    for secret in secrets:
        assert secret not in text


class RecordingHook:
    """A RateLimitHook that records what the provider reserved and observed."""

    def __init__(self, deny_after: int | None = None) -> None:
        self.reserved: list[tuple[str, ...]] = []
        self.observed: list[list[WindowUsage]] = []
        self.deny_after = deny_after

    def reserve(self, windows: Sequence[str]) -> None:
        if self.deny_after is not None and len(self.reserved) >= self.deny_after:
            raise ProviderRateLimited(next_short_reset(datetime.now(UTC)), "short")
        self.reserved.append(tuple(windows))

    def observe(self, usage: Sequence[WindowUsage], headers: Mapping[str, str]) -> None:
        self.observed.append(list(usage))


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def core(nats_url: str, s3_endpoint: str) -> Iterator[DevCairnCore]:
    with DevCairnCore(nats_url, s3_endpoint, bucket=f"handlers-{uuid.uuid4().hex[:8]}") as c:
        yield c


@pytest.fixture(scope="module")
def strava() -> Iterator[FakeStrava]:
    with FakeStrava() as fake:
        yield fake


@pytest.fixture()
def pool() -> str:
    return f"pool-{uuid.uuid4().hex[:10]}"


@pytest.fixture()
def ctx(nats_url: str, fresh_redis: str, strava: FakeStrava, pool: str) -> Iterator[JobContext]:
    with job_context(nats_url, fresh_redis, strava, pool) as context:
        yield context


@pytest.fixture()
def athlete(core: DevCairnCore, strava: FakeStrava, pool: str) -> Athlete:
    return Athlete(core, strava, pool)


# The handler reads the clock at Strava's 429, between the test's readings before and after the job; this
# covers the rounding between its clock and theirs.
CLOCK_SLACK_S = 1.0


def assert_naks_until_the_short_window(delay_s: float | None, started: datetime, ended: datetime) -> None:
    """``delay_s`` runs from the 429 (a moment between ``started`` and ``ended``) to Strava's next short-window
    reset, plus the grace: a bound that holds however long a loaded box took to run the job."""
    assert delay_s is not None
    bounds = [((reset - ended).total_seconds() + RESET_GRACE_S, (reset - started).total_seconds() + RESET_GRACE_S)
              for reset in {next_short_reset(started), next_short_reset(ended)}]
    assert any(low - CLOCK_SLACK_S <= delay_s <= high + CLOCK_SLACK_S for low, high in bounds), (delay_s, bounds)
