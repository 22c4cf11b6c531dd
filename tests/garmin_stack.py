"""A Cairn test stack running a Garmin pool: the dev core, the fake Garmin Connect, real bridge and worker.

``CairnStack`` with ``CAIRN_PROVIDER=garmin`` and the three ``CAIRN_GARMIN_*``
variables that point garth at the fake (its CONNECT proxy and CA bundle). The
pool's environment drops ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``: with them
set, requests would verify garth's OAuth calls against the system bundle and the
pool refuses to start (``workers/providers/garmin/settings.py``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from deploy.devstack.garmin import FakeGarmin
from deploy.devstack.garmin.data import FakeAccount
from tests.cairn_stack import CairnStack

GARMIN = "garmin"
GARMIN_PACKAGE = "switchyard.providers.garmin"
CA_OVERRIDES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


@dataclass
class GarminStack(CairnStack):
    provider: str = GARMIN
    garmin: FakeGarmin | None = None

    def start(self) -> GarminStack:
        super().start()
        self.garmin = FakeGarmin().start()
        return self

    def stop(self) -> None:
        super().stop()
        if self.garmin is not None:
            self.garmin.stop()

    @property
    def env(self) -> dict[str, str]:
        env = super().env
        for name in CA_OVERRIDES:
            env.pop(name, None)
        env.update({"CAIRN_WORKER_PACKAGE": GARMIN_PACKAGE, **(self.garmin.pool_env if self.garmin else {})})
        env.update(self.extra_env)
        return env

    def connect_garmin(self, n_activities: int = 3, *, mfa: bool = False, locked: bool = False,
                       password: str | None = None) -> tuple[Any, FakeAccount]:
        """A Garmin login at the fake and its credentials connection at core (the two slots)."""
        assert self.core is not None and self.garmin is not None
        email = f"athlete-{uuid.uuid4().hex[:8]}@example.com"
        secret = f"pw-{uuid.uuid4().hex}"
        account = self.garmin.add_account(email, secret, n_activities, mfa=mfa, locked=locked)
        acct = self.core.connect_account(GARMIN, None, None, None, None, worker_name=self.pool,
                                         client_id=email, client_secret=password or secret)
        return acct, account
