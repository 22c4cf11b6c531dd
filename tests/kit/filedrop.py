"""The ``filedrop`` test provider as a distribution and its file drop as a provider fake.

``filedrop`` (tests/fixtures/filedrop/switchyard_filedrop.py) is a tiny provider
shipped as its own distribution: :func:`install_distribution` writes it into a
site directory next to a ``dist-info`` whose ``entry_points.txt`` registers it
in the ``switchyard.providers`` group, as pip would leave it, and a process
with that directory on its ``PYTHONPATH`` finds it the way it would find an
installed package. Its "API" is a file drop on loopback (:class:`FileDrop`:
``/files`` and ``/files/<id>`` behind a bearer token).

:class:`FileDropKit` is the drop as the Cairn stack kit's ``ProviderFake``
(``devstack/fakes/provider_fake.py``): the variables a pool needs (the drop's
URL, the site directory, the distribution's package name) and accounts
connected on a pool. Used by tests/providers/test_second_provider.py and
tests/providers/test_pools.py (a second real pool beside Strava's).
"""

from __future__ import annotations

import itertools
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from devstack.fakes.cairn_core import DevCairnCore
from devstack.fakes.http_server import BackgroundServer
from devstack.fakes.provider_fake import Connected, DemoSize, Pool
from devstack.infra import plugins
from workers.providers.registry import ENTRY_POINT_GROUP

PROVIDER = "filedrop"
MODULE = "switchyard_filedrop"
PROVIDER_SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "filedrop" / f"{MODULE}.py"
DISTRIBUTION = "switchyard-filedrop"
DIST_VERSION = "0.1.0"
APP_CLIENT_ID = "filedrop-app-1"
TOKEN_LIFETIME = timedelta(hours=6)
FILES = [{"id": "f-101", "sport": "run", "title": "Morning run", "start": "2026-07-01T06:00:00Z", "elapsed_s": 1800},
         {"id": "f-102", "sport": "ride", "title": "Commute", "start": "2026-07-02T08:00:00Z", "elapsed_s": 2400}]


def install_distribution(site: Path) -> Path:
    """An installed distribution, as pip would leave it: the module and its dist-info."""
    return plugins.install_distribution(site, name=DISTRIBUTION, version=DIST_VERSION, modules=[PROVIDER_SOURCE],
                                        entry_points={ENTRY_POINT_GROUP: {PROVIDER: f"{MODULE}:FileDropProvider"}})


class FileDrop:
    """The file drop the provider reads: ``/files`` and ``/files/<id>``, bearer token required."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.requests: list[str] = []
        self._lock = threading.Lock()
        app = Starlette(routes=[Route("/files", self._list), Route("/files/{file_id}", self._get)])
        self.server = BackgroundServer(app, "fake-filedrop")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def _authorized(self, request: Request) -> bool:
        with self._lock:
            self.requests.append(request.url.path)
        return request.headers.get("authorization") == f"Bearer {self.token}"

    async def _list(self, request: Request) -> JSONResponse:
        if not self._authorized(request):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        return JSONResponse([{"id": f["id"], "start": f["start"]} for f in FILES])

    async def _get(self, request: Request) -> JSONResponse:
        if not self._authorized(request):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        found = [f for f in FILES if f["id"] == request.path_params["file_id"]]
        return JSONResponse(found[0]) if found else JSONResponse({"error": "not found"}, status_code=404)


class FileDropKit:
    """The drop as a ``ProviderFake``: every account sees the drop's files through the one token."""

    provider = PROVIDER
    demo_size = DemoSize(full=len(FILES), short=len(FILES))  # every account sees the same files

    def __init__(self, site: Path) -> None:
        self.site = site
        self.drop = FileDrop(token=f"fd-{uuid.uuid4().hex}")
        self._owners = itertools.count(1)

    def start(self) -> FileDropKit:
        self.drop.server.start()
        return self

    def stop(self) -> None:
        self.drop.server.stop()

    def pool_env(self) -> dict[str, str]:
        return {"CAIRN_FILEDROP_BASE_URL": self.drop.base_url, "CAIRN_WORKER_PACKAGE": DISTRIBUTION,
                "PYTHONPATH": str(self.site)}  # the processes run from the repository root, still importable

    def connect(self, core: DevCairnCore, pool: Pool, n_activities: int) -> Connected:
        """An owner of the drop connected on ``pool``; its activities are the drop's first files."""
        account = core.connect_account(PROVIDER, None, self.drop.token, f"rt-{uuid.uuid4().hex}",
                                       datetime.now(UTC) + TOKEN_LIFETIME, worker_name=pool.worker_name,
                                       external_id=f"drop-owner-{next(self._owners)}", client_id=APP_CLIENT_ID,
                                       client_secret="unused")
        return Connected(pool, account, tuple(str(f["id"]) for f in FILES[:n_activities]))
