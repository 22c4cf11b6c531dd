"""What the Cairn stack kit asks of a provider's fake, and the pool and account shapes it hands out.

A provider's fake API lives in ``devstack/<provider>/`` (the fake Strava,
the fake Garmin); its ``kit.py`` wraps it as a :class:`ProviderFake`, so the kit
(``devstack/infra/cairn_stack.py``), the two-pools test and the demo serve any
provider the same way: the variables a pool needs to reach the fake, and a
connected account with activities to import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from devstack.fakes.cairn_core import DevCairnCore
from devstack.fakes.cairn_core.accounts import Account
from devstack.infra.nats_auth import Pool  # one pool: <provider>.<worker_name>, as NATS grants it

__all__ = ["Connected", "DemoSize", "Pool", "ProviderFake"]


@dataclass(frozen=True)
class DemoSize:
    """How many activities the account ``make demo`` connects on a pool of this provider gets."""

    full: int
    short: int  # ``--short``, what the tests run


@dataclass(frozen=True)
class Connected:
    """An account connected on a pool at the dev core, and its activities at the fake, oldest first."""

    pool: Pool
    account: Account
    ext_ids: tuple[str, ...]

    @property
    def account_id(self) -> str:
        return self.account.account_id

    @property
    def user_id(self) -> str:
        return self.account.user_id


class ProviderFake(Protocol):
    """What the kit asks of one provider's fake API (``devstack/<provider>/kit.py``)."""

    provider: str
    demo_size: DemoSize

    def start(self) -> object: ...

    def stop(self) -> None: ...

    def pool_env(self) -> dict[str, str]:
        """The ``CAIRN_<PROVIDER>_*`` variables a pool needs to reach this fake."""
        ...

    def connect(self, core: DevCairnCore, pool: Pool, n_activities: int) -> Connected:
        """A new account at the fake with ``n_activities``, connected on ``pool`` at core."""
        ...
