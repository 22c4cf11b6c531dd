"""The Cairn side of the embedded stack: one kit for the tests, ``bench/`` and ``make demo``.

Every Cairn run needs the same world: nats-server with JetStream, the dev Cairn
core (presign responders on S3, strict result router), one fake API per
provider, and pools on top of them: the environment a pool's processes get,
accounts connected on a pool, the job bodies core publishes for them. This
module starts and stops that world in one place, so the test stack
(``tests/cairn_stack.py``), the benchmarks (``bench/cairn_bench.py``,
``bench/chaos_rig.py``) and the demo (``devstack/demo.py``) build on it instead
of each keeping its copy.

Providers plug in as :class:`ProviderFake`: the fake API of one provider
(``devstack/<provider>/``) with what the kit asks of it
(``devstack/fakes/provider_fake.py``): the variables a pool needs to reach it
and a way to connect an account with activities (``devstack/fakes/strava/kit.py``,
``devstack/fakes/garmin/kit.py``). A stack with both fakes is
``CairnStack(..., fakes=[StravaKit(), GarminKit()])``; nothing else changes.

Redis and S3 are given when the caller already runs them (the tests' session
services, the demo's Voicy side) and are then left to the caller; otherwise
they are started here and stopped with the stack. NATS runs under core's
production permissions (``devstack.infra.nats_auth``): core logs in as
``core``, and every pool as its own worker user holding core's template for
that pool, granted as the pool is first used (:meth:`CairnStack.pool_env`).
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats

from devstack.fakes.cairn_core import DevCairnCore
from devstack.fakes.cairn_core.accounts import Account
from devstack.fakes.garmin.kit import GarminKit
from devstack.fakes.provider_fake import Connected, Pool, ProviderFake
from devstack.fakes.strava.kit import StravaKit
from devstack.infra import services
from devstack.infra.nats_auth import NatsAuth
from devstack.infra.procs import Proc
from workers.cairn.contract import subjects
from workers.cairn.settings import pool_variable

__all__ = ["CairnStack", "Connected", "Pool", "ProviderFake", "clean_env"]

# Ambient variables a stack's processes must not inherit: they would point a pool elsewhere.
FOREIGN_PREFIXES = ("VOICY_", "CAIRN_", "AWS_")
# requests' CA-bundle overrides: a fake brings its own CA (the fake Garmin's, CAIRN_GARMIN_CA_BUNDLE), and
# these would override it inside garth, so a Garmin pool refuses to start with them set elsewhere.
CA_OVERRIDES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
DEFAULT_REASON = "backfill"


# provider → its fake's kit (``devstack/<provider>/kit.py``): a third provider's fake is one more line
FAKE_KITS: dict[str, type[ProviderFake]] = {StravaKit.provider: StravaKit, GarminKit.provider: GarminKit}


def clean_env() -> dict[str, str]:
    """This process's environment minus anything that would point a child at another deployment
    or another CA than the fakes'."""
    return {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_PREFIXES) and k not in CA_OVERRIDES}


@dataclass
class CairnStack:
    """NATS, the dev core and the provider fakes; ``start()``, then pools on top, ``stop()`` in reverse."""

    workdir: Path
    redis_url: str | None = None  # given: the caller's Redis; None: one is started (and stopped) here
    s3_endpoint: str | None = None  # given: the caller's S3; None: moto is started here
    fakes: Sequence[ProviderFake] = ()  # default: the fake Strava alone
    name: str = field(default_factory=lambda: f"sy-{uuid.uuid4().hex[:6]}")
    moto_process: bool = False  # moto in a process of its own (benchmarks: not on the caller's GIL)
    redis_appendonly: bool = False  # the started Redis keeps an AOF (the chaos harness restarts it)
    pools: Sequence[Pool] = ()  # granted NATS users at start (the first is ``worker``); others when first used
    nats_withheld: tuple[str, ...] = ()  # subjects left out of every pool's template (a refusal test)
    nats_anonymous: bool = True  # False: NATS refuses a client without a login, as a production core does
    redis: services.Service | None = None
    nats: services.Service | None = None
    core: DevCairnCore | None = None
    _moto: services.Service | Proc | None = None
    _providers: dict[str, ProviderFake] = field(default_factory=dict)

    def start(self) -> CairnStack:
        if not self.fakes:
            self.fakes = [StravaKit()]
        self._providers = {fake.provider: fake for fake in self.fakes}
        if self.redis_url is None:
            self.redis = services.start_redis(self.workdir / "redis", appendonly=self.redis_appendonly)
            self.redis_url = self.redis.url
        self.nats = services.start_nats(self.workdir / "nats", pools=self.pools, withheld=self.nats_withheld,
                                        anonymous=self.nats_anonymous)
        if self.s3_endpoint is None:
            if self.moto_process:
                self.s3_endpoint, self._moto = services.start_moto_process(self.workdir)
            else:
                self._moto = services.start_moto()
                self.s3_endpoint = self._moto.url
        self.core = DevCairnCore(self.nats.url, self.s3_endpoint, bucket=f"cairn-{self.name}",
                                 nats_login=self.nats_auth.core.connect_options()).start()
        for fake in self.fakes:
            fake.start()
        return self

    def stop(self) -> None:
        """Newest first: the fakes, core, NATS, then S3 and Redis if this stack started them."""
        for fake in reversed(list(self.fakes)):
            fake.stop()
        if self.core is not None:
            self.core.stop()
        if self.nats is not None:
            self.nats.stop()
        if isinstance(self._moto, Proc):
            self._moto.stop()
        elif self._moto is not None:
            services.stop_moto(self._moto)
        if self.redis is not None:
            self.redis.stop()

    @property
    def nats_auth(self) -> NatsAuth:
        """The NATS server's users, config and log (``violations()``: every permission refusal)."""
        assert self.nats is not None, "start() first"
        return services.nats_auth_of(self.nats)

    def processes(self) -> list[Proc]:
        """The child processes this stack runs as ``Proc`` (moto, when it has a process of its own)."""
        return [self._moto] if isinstance(self._moto, Proc) else []

    # ------------------------------------------------------------------ pools
    def fake(self, provider: str) -> ProviderFake:
        return self._providers[provider]

    def pool(self, provider: str, worker_name: str | None = None) -> Pool:
        """A pool of ``provider`` on this stack (a fresh name unless one is given)."""
        if provider not in self._providers:
            raise KeyError(f"no {provider} fake on this stack (fakes: {', '.join(self._providers)})")
        return Pool(provider, worker_name or f"{self.name}-{provider}")

    def pool_env(self, pool: Pool, *, scoped: bool = False) -> dict[str, str]:
        """The variables that make a process one of ``pool``'s: NATS and its login as the pool's worker
        user (core's template for this pool), its identity, its provider fake (what a fleet environment
        of the caller's, the demo's or the chaos harness's, adds).

        ``scoped``: for an environment several pools share (the demo's Procfile fleet): the login under
        the pool's own names (``CAIRN_POOL_<NAME>_NATS_USER`` …, ``workers.cairn.settings.pool_variable``)
        and no identity, which each pool's Procfile lines set themselves.
        """
        assert self.nats is not None, "start() first"
        login = services.nats_login(self.nats, pool.provider, pool.worker_name)  # granted if new
        fake = self._providers.get(pool.provider)  # None: a provider whose fake the caller runs itself
        env = {"CAIRN_NATS_URL": self.nats.url, **(fake.pool_env() if fake else {})}
        if scoped:
            return {**env, pool_variable(pool.worker_name, "nats_user"): login.user,
                    pool_variable(pool.worker_name, "nats_password"): login.password}
        return {**env, "CAIRN_PROVIDER": pool.provider, "CAIRN_WORKER_NAME": pool.worker_name, **login.env()}

    def env(self, pool: Pool, **overrides: str) -> dict[str, str]:
        """The whole environment of one pool's processes (bridge and workers): the caller's minus
        foreign deployments' variables, this interpreter's ``bin`` first on ``PATH`` (a Procfile line
        says ``celery``), Redis, :meth:`pool_env`; ``overrides`` last."""
        assert self.redis_url is not None, "start() first"
        env = clean_env()
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        return {**env, "REDIS_URL": self.redis_url, "PYTHONUNBUFFERED": "1", **self.pool_env(pool), **overrides}

    def connect(self, pool: Pool, n_activities: int = 3) -> Connected:
        """A new account with ``n_activities`` at the pool's fake, connected on the pool at core."""
        assert self.core is not None, "start() first"
        return self.fake(pool.provider).connect(self.core, pool, n_activities)

    # ------------------------------------------------------------------ jobs
    @staticmethod
    def fetch_job(acct: Connected | Account, ext_id: str, *, job_id: str | None = None,
                  reason: str = DEFAULT_REASON, fetch_streams: bool = True) -> dict[str, Any]:
        """The fetch_source body core publishes for one activity of ``acct`` (contract §4)."""
        account = acct.account if isinstance(acct, Connected) else acct
        return {"job_id": job_id or f"job-{uuid.uuid4().hex[:10]}", "account_id": account.account_id,
                "user_id": account.user_id, "provider": account.provider, "ext_id": ext_id,
                "fetch_streams": fetch_streams, "reason": reason}

    def fetch_jobs(self, accounts: Iterable[Connected], **kw: Any) -> list[dict[str, Any]]:
        """One fetch_source body per activity of each account."""
        return [self.fetch_job(acct, ext_id, **kw) for acct in accounts for ext_id in acct.ext_ids]

    def publish_raw(self, pool: Pool, kind: str, body: bytes) -> None:
        """Publish bytes on a pool's job subject as core would (poison tests)."""
        assert self.nats is not None, "start() first"
        url = self.nats.url

        async def run() -> None:
            nc = await nats.connect(url)
            try:
                await nc.jetstream().publish(subjects.job_subject(kind, pool.provider, pool.worker_name), body,
                                             headers={"Nats-Msg-Id": f"raw:{uuid.uuid4().hex}"})
            finally:
                await nc.close()

        asyncio.run(run())

    def consumer(self, pool: Pool, kind: str) -> dict[str, Any]:
        """The pool's durable consumer of ``kind`` on CAIRN_JOBS, as core sees it."""
        assert self.core is not None, "start() first"
        subject = subjects.job_subject(kind, pool.provider, pool.worker_name)
        return next(c for c in self.core.consumers() if c["filter_subject"] == subject)

    def results_for(self, job_id: str) -> list[Any]:
        """The activity results core accepted for ``job_id`` (segment results left out)."""
        assert self.core is not None, "start() first"
        return [r for r in self.core.ingested if r.msg_id and f":{job_id}" in r.msg_id
                and not r.msg_id.endswith(":seg")]
