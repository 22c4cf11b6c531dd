"""Fake Garmin Connect for tests, the demo and the benchmark: SSO, OAuth, the Connect API, FIT originals.

It serves what the Garmin pool's library (garth) really sends, on Garmin's own
host names, over TLS: an HTTPS server on loopback with a certificate for
``sso.garmin.com``, ``connectapi.garmin.com`` and ``thegarth.s3.amazonaws.com``
(``devstack/infra/tls.py``, a throwaway CA of its own), reached through a CONNECT proxy
(``proxy.py``). A pool points at it with three variables, no system file
touched (``FakeGarmin.pool_env``)::

    CAIRN_GARMIN_PROXY_URL=http://127.0.0.1:<proxy port>
    CAIRN_GARMIN_CA_BUNDLE=<tmp>/ca.pem
    CAIRN_GARMIN_DOMAIN=garmin.com

The sign-in side is ``sso.py``, the API ``connect.py``, the accounts and FIT
files ``data.py``. ``FakeGarmin`` is the facade tests drive: accounts (with
MFA or locked), activities, corrupt originals, injected failures, revoked
sessions, and the request log (never a secret).
"""

from __future__ import annotations

import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Host, Route, Router

from devstack.fakes.garmin.connect import ConnectRoutes
from devstack.fakes.garmin.data import FakeAccount, FakeActivity
from devstack.fakes.garmin.proxy import ConnectProxy
from devstack.fakes.garmin.sso import ENDPOINTS, Fault, GarminState, RequestRecord, SsoRoutes
from devstack.fakes.http_server import BackgroundServer
from devstack.infra.tls import issue

__all__ = ["DOMAIN", "ENDPOINTS", "FakeAccount", "FakeActivity", "FakeGarmin", "RequestRecord"]

DOMAIN = "garmin.com"
CONSUMER_HOST = "thegarth.s3.amazonaws.com"


class FakeGarmin:
    """The fake's HTTPS server, its proxy and its state; ``start()``/``stop()`` or a ``with`` block."""

    def __init__(self, domain: str = DOMAIN) -> None:
        self.domain = domain
        self.state = GarminState()
        sso, api = SsoRoutes(self.state), ConnectRoutes(self.state)
        self.hosts = [f"sso.{domain}", f"connectapi.{domain}", CONSUMER_HOST]
        self.app = Starlette(routes=[
            Host(self.hosts[0], app=Router(routes=[
                Route("/mobile/sso/en/sign-in", sso.sign_in),
                Route("/mobile/api/login", sso.login, methods=["POST"]),
                Route("/portal/sso/embed", sso.embed)])),
            Host(self.hosts[1], app=Router(routes=[
                Route("/oauth-service/oauth/preauthorized", sso.preauthorized),
                Route("/oauth-service/oauth/exchange/user/2.0", sso.exchange, methods=["POST"]),
                Route("/activitylist-service/activities/search/activities", api.list_activities),
                Route("/activity-service/activity/{activity_id:int}", api.activity),
                Route("/gear-service/gear/filterGear", api.gear),
                Route("/download-service/files/activity/{activity_id:int}", api.download)])),
            Host(CONSUMER_HOST, app=Router(routes=[Route("/oauth_consumer.json", sso.consumer)])),
        ])
        self._tmp = tempfile.TemporaryDirectory(prefix="fake-garmin-")
        self.certs = issue(Path(self._tmp.name), self.hosts)
        self.server = BackgroundServer(self.app, "fake-garmin", uvicorn_options={
            "ssl_certfile": str(self.certs.certfile), "ssl_keyfile": str(self.certs.keyfile)})
        self.proxy: ConnectProxy | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeGarmin:
        self.server.start()
        self.proxy = ConnectProxy(self.hosts, self.server.port).start()
        return self

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        self.server.stop()
        self._tmp.cleanup()

    def __enter__(self) -> FakeGarmin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pool_env(self) -> dict[str, str]:
        """The ``CAIRN_GARMIN_*`` variables that point a Garmin pool here."""
        assert self.proxy is not None, "start() the fake first"
        return {"CAIRN_GARMIN_PROXY_URL": self.proxy.url, "CAIRN_GARMIN_CA_BUNDLE": str(self.certs.ca_bundle),
                "CAIRN_GARMIN_DOMAIN": self.domain}

    # ------------------------------------------------------------------ data

    def add_account(self, email: str, password: str, n_activities: int = 3, *, mfa: bool = False,
                    locked: bool = False) -> FakeAccount:
        with self.state.lock:
            account = FakeAccount(email, password, len(self.state.accounts), mfa=mfa, locked=locked)
            self.state.accounts[email] = account
        for _ in range(n_activities):
            account.add_activity()
        return account

    def account(self, email: str) -> FakeAccount:
        return self.state.accounts[email]

    def add_activity(self, email: str, start: datetime | None = None) -> FakeActivity:
        return self.account(email).add_activity(start)

    def set_original(self, email: str, activity_id: int, body: bytes) -> None:
        """Serve ``body`` as the activity's original: FIT bytes are zipped as Garmin does, a zip as is."""
        self.account(email).activities[activity_id].fit_override = body

    def change_password(self, email: str, password: str) -> None:
        self.account(email).password = password
        self.state.revoke(email)

    def revoke_sessions(self, email: str) -> None:
        self.state.revoke(email)

    # ------------------------------------------------------------------ faults and observations

    def fail(self, endpoint: str, status: int, times: int = 1, *, retry_after_s: int | None = None,
             body: dict[str, Any] | None = None) -> None:
        """The next ``times`` requests to ``endpoint`` (one of ``ENDPOINTS``) answer ``status``."""
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}, expected one of {ENDPOINTS}")
        headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else {}
        with self.state.lock:
            self.state.faults.setdefault(endpoint, []).append(Fault(status, times, headers, body))

    @property
    def requests(self) -> list[RequestRecord]:
        with self.state.lock:
            return list(self.state.requests)

    def calls(self, endpoint: str, email: str | None = None) -> int:
        return sum(1 for r in self.requests if r.endpoint == endpoint and (email is None or r.email == email))

    def logins(self, email: str) -> int:
        with self.state.lock:
            return self.state.logins[email]
