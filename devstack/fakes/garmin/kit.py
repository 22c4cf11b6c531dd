"""The fake Garmin Connect as the Cairn stack kit uses it (``devstack.fakes.provider_fake.ProviderFake``).

A pool reaches the fake through ``CAIRN_GARMIN_PROXY_URL``,
``CAIRN_GARMIN_CA_BUNDLE`` and ``CAIRN_GARMIN_DOMAIN`` (garth has no base URL:
docs/DESIGN.md, "Garmin: pointing garth at the fake"). An account is a Garmin
login at the fake with generated activities, connected at the dev core on the
pool as a credentials connection: core holds the email and password in the
connection's two slots (``client_id``/``client_secret``) and hands them out on
``cairn.creds.garmin.get`` (contract §9), as for a user who typed them in.
"""

from __future__ import annotations

import uuid

from devstack.fakes.cairn_core import DevCairnCore
from devstack.fakes.garmin import FakeGarmin
from devstack.fakes.garmin.data import FakeAccount
from devstack.fakes.provider_fake import Connected, DemoSize, Pool

PROVIDER = "garmin"
EMAIL_DOMAIN = "example.com"


class GarminKit:
    """One fake Garmin Connect (started by the stack unless already running) and the logins on it."""

    provider = PROVIDER
    demo_size = DemoSize(full=6, short=2)  # a FIT original each: heavier to write and parse than Strava's JSON

    def __init__(self, fake: FakeGarmin | None = None) -> None:
        self.fake = fake or FakeGarmin()

    def start(self) -> GarminKit:
        if self.fake.proxy is None:
            self.fake.start()
        return self

    def stop(self) -> None:
        self.fake.stop()

    def pool_env(self) -> dict[str, str]:
        return self.fake.pool_env

    def connect(self, core: DevCairnCore, pool: Pool, n_activities: int, *, mfa: bool = False,
                locked: bool = False, password: str | None = None) -> Connected:
        """A new Garmin login with ``n_activities``, connected on ``pool`` with its email and password.

        ``mfa``/``locked``: the fake's SSO asks for a second factor or refuses the account;
        ``password``: core holds this one instead of the right one (a user who mistyped it).
        """
        email = f"athlete-{uuid.uuid4().hex[:8]}@{EMAIL_DOMAIN}"
        secret = f"pw-{uuid.uuid4().hex}"
        login = self.fake.add_account(email, secret, n_activities, mfa=mfa, locked=locked)
        account = core.connect_account(PROVIDER, None, None, None, None, worker_name=pool.worker_name,
                                       client_id=email, client_secret=password or secret)
        return Connected(pool, account, tuple(str(a.activity_id) for a in reversed(login.newest_first())))

    def login(self, connected: Connected) -> FakeAccount:
        """The fake's side of a connected account (its activities, its sign-ins)."""
        return self.fake.account(connected.account.client_id)
