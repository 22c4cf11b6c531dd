"""The fake Strava as the Cairn stack kit uses it (``devstack.fakes.provider_fake.ProviderFake``).

A pool reaches the fake through ``CAIRN_STRAVA_BASE_URL``; an account is a
fake athlete with generated activities, connected at the dev core on the
pool with the athlete's tokens and the app that issued them. ``own_app``
gives an athlete an app of its own, so its rate-limit budget is its own.
"""

from __future__ import annotations

import itertools
import uuid

from devstack.fakes.cairn_core import DevCairnCore
from devstack.fakes.provider_fake import Connected, DemoSize, Pool
from devstack.fakes.strava.api import FakeStrava

PROVIDER = "strava"
ATHLETE_ID_BASE = 7000  # fake athlete ids start above this; every kit counts on from it


class StravaKit:
    """One fake Strava (started by the stack unless already running) and the athletes connected on it."""

    provider = PROVIDER
    demo_size = DemoSize(full=20, short=5)

    def __init__(self, fake: FakeStrava | None = None, *, athlete_id_base: int = ATHLETE_ID_BASE) -> None:
        self.fake = fake or FakeStrava()
        self._ids = itertools.count(athlete_id_base + 1)

    def start(self) -> StravaKit:
        if self.fake.http is None:
            self.fake.start()
        return self

    def stop(self) -> None:
        self.fake.stop()

    def pool_env(self) -> dict[str, str]:
        return {"CAIRN_STRAVA_BASE_URL": self.fake.base_url}

    def connect(self, core: DevCairnCore, pool: Pool, n_activities: int, *, athlete_id: int | None = None,
                own_app: bool = False, with_gear: bool = True) -> Connected:
        """A fake athlete with ``n_activities``, connected on ``pool`` (``own_app``: its own budget)."""
        athlete_id = athlete_id if athlete_id is not None else next(self._ids)
        client_id, secret = self.fake.client_id, self.fake.client_secret
        if own_app:
            client_id, secret = f"app-{athlete_id}", f"secret-{uuid.uuid4().hex}"
            self.fake.add_app(client_id, secret)
        athlete = self.fake.add_athlete(athlete_id, n_activities=n_activities, with_gear=with_gear,
                                        client_id=client_id)
        account = core.connect_account(PROVIDER, None, athlete.access_token, athlete.refresh_token,
                                       athlete.expires_at, worker_name=pool.worker_name, external_id=athlete_id,
                                       client_id=client_id, client_secret=secret)
        return Connected(pool, account, tuple(str(a) for a in sorted(athlete.activities)))
