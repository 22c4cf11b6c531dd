"""A Cairn test stack running a Garmin pool: the devstack kit with the fake Garmin Connect, real bridge and worker.

``tests.cairn_stack.CairnStack`` with ``CAIRN_PROVIDER=garmin`` and the kit's
``GarminKit`` (``devstack/fakes/garmin/kit.py``) as its one provider fake: the
pool's environment is the kit's, the ``CAIRN_GARMIN_*`` variables that point
garth at the fake (its CONNECT proxy and CA bundle) included, and an account is
the kit's credentials connection. The stack's gate holds the fake's original-file downloads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from devstack.fakes.garmin import FakeGarmin
from devstack.fakes.garmin.data import FakeAccount
from devstack.fakes.garmin.kit import PROVIDER as GARMIN
from devstack.fakes.garmin.kit import GarminKit
from devstack.infra.cairn_stack import Connected, ProviderFake
from tests.kit.cairn_stack import CairnStack
from tests.kit.gate import Gate, GateMiddleware

GARMIN_PACKAGE = "switchyard.providers.garmin"  # CAIRN_WORKER_PACKAGE's default for the garmin provider
GARMIN_DOWNLOAD_PATH = r"/download-service/files/activity/\d+$"  # the gate holds an activity's original file


@dataclass
class GarminStack(CairnStack):
    extra_env: dict[str, str] = field(default_factory=lambda: {"CAIRN_PROVIDER": GARMIN})
    gate: Gate = field(default_factory=lambda: Gate.path_pattern(GARMIN_DOWNLOAD_PATH))

    def provider_fakes(self) -> list[ProviderFake]:
        kit = GarminKit()
        kit.fake.app.add_middleware(GateMiddleware, gate=self.gate)
        return [kit]

    @property
    def garmin_kit(self) -> GarminKit:
        assert self.kit is not None, "start() first"
        kit = self.kit.fake(GARMIN)
        assert isinstance(kit, GarminKit)
        return kit

    @property
    def garmin(self) -> FakeGarmin | None:
        return self.garmin_kit.fake if self.kit is not None else None

    def connect_garmin(self, n_activities: int = 3, *, mfa: bool = False, locked: bool = False,
                       password: str | None = None) -> tuple[Connected, FakeAccount]:
        """A Garmin login at the fake and its credentials connection on the pool at core (the two slots)."""
        connected = self.garmin_kit.connect(self.core, self.pool_ref, n_activities, mfa=mfa, locked=locked,
                                            password=password)
        return connected, self.garmin_kit.login(connected)
