"""``PoolContext``: who the pool is and how it reaches core, the one shape every Cairn context has."""

from __future__ import annotations

import dataclasses
from typing import Any

from workers.cairn.claimcheck import WorkerStamp
from workers.cairn.compat import CoreGate
from workers.providers.base import Provider


@dataclasses.dataclass
class PoolContext:
    """Settings, provider and NATS connection, with the pool's identity derived from them.

    The base of both the presence context (main process) and the job context (pool processes),
    so code shared by both (the ``webhooks`` flag, the core-release gate) finds the same fields.
    """

    settings: Any  # workers.cairn.settings.CairnSettings
    provider: Provider
    nats: Any  # workers.cairn.nats_conn.NatsThread (``run(coro, timeout)``, ``nc``, ``js``)
    _core_gate: CoreGate | None = dataclasses.field(default=None, repr=False, kw_only=True)

    @property
    def provider_name(self) -> str:
        return str(getattr(self.settings, "provider", "") or self.provider.name)

    @property
    def worker_name(self) -> str:
        return str(self.settings.worker_name)

    @property
    def worker_package(self) -> str:
        return str(getattr(self.settings, "worker_package", "") or getattr(self.settings, "package", ""))

    @property
    def worker_version(self) -> str:
        """The parser version ``N.M`` (contract §1: ``worker_version`` is the parser version)."""
        return str(self.provider.parser_version)

    @property
    def worker_stamp(self) -> WorkerStamp:
        """The stamp every ``JobResult`` carries (contract §1, invariant C3)."""
        return WorkerStamp(self.worker_name, self.worker_version, self.worker_package)

    @property
    def core_gate(self) -> CoreGate:
        """This context's core-release verdict (contract §1), cached; presence/manifest ask it."""
        if self._core_gate is None:
            self._core_gate = CoreGate(str(getattr(self.settings, "release", "")))
        return self._core_gate
