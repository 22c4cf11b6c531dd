"""Plug-ins the benchmarks install as distributions of their own (``devstack.infra.plugins``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.plugins import switchyard_null as null
from devstack.fakes.cairn_core import DevCairnCore
from devstack.fakes.provider_fake import Connected, DemoSize, Pool
from devstack.infra.plugins import install_distribution
from workers.providers.registry import ENTRY_POINT_GROUP as PROVIDERS
from workers.transcribe.registry import ENTRY_POINT_GROUP as ENGINES

NULL = null.NAME  # CAIRN_PROVIDER and VOICY_WORKER_TRANSCRIBER of the null plug-ins
NULL_DISTRIBUTION = null.DISTRIBUTION
TOKEN_LIFETIME = timedelta(hours=6)


def install_null(site: Path) -> Path:
    """``switchyard-null`` (the null provider and engine) into ``site``; returns it for ``PYTHONPATH``."""
    return install_distribution(site, name=null.DISTRIBUTION, version=null.VERSION, modules=[Path(null.__file__)],
                                entry_points={PROVIDERS: {null.NAME: null.PROVIDER_ENTRY},
                                              ENGINES: {null.NAME: null.ENGINE_ENTRY}})


class NullKit:
    """The null provider as the Cairn kit's ``ProviderFake``: no API to run, accounts connected at core."""

    provider = NULL
    demo_size = DemoSize(full=25, short=5)  # the kit's protocol asks for one; the demo runs no null pool

    def __init__(self, site: Path) -> None:
        self.site = site

    def start(self) -> NullKit:
        return self

    def stop(self) -> None:
        return None

    def pool_env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(self.site)}  # the processes find the plug-in as an installed distribution

    def connect(self, core: DevCairnCore, pool: Pool, n_activities: int) -> Connected:
        owner = uuid.uuid4().hex[:10]
        account = core.connect_account(NULL, None, f"tok-{owner}", f"rt-{owner}", datetime.now(UTC) + TOKEN_LIFETIME,
                                       worker_name=pool.worker_name, external_id=f"null-{owner}",
                                       client_id="null-app", client_secret="unused")
        return Connected(pool, account, tuple(f"{owner}-{i}" for i in range(n_activities)))
