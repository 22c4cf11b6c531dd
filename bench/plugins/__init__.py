"""Plug-ins the benchmarks install as distributions of their own (``deploy.devstack.plugins``)."""

from __future__ import annotations

from pathlib import Path

from bench.plugins import switchyard_null as null
from deploy.devstack.plugins import install_distribution
from workers.providers.registry import ENTRY_POINT_GROUP as PROVIDERS
from workers.transcribe.registry import ENTRY_POINT_GROUP as ENGINES

NULL = null.NAME  # CAIRN_PROVIDER and VOICY_WORKER_TRANSCRIBER of the null plug-ins
NULL_DISTRIBUTION = null.DISTRIBUTION


def install_null(site: Path) -> Path:
    """``switchyard-null`` (the null provider and engine) into ``site``; returns it for ``PYTHONPATH``."""
    return install_distribution(site, name=null.DISTRIBUTION, version=null.VERSION, modules=[Path(null.__file__)],
                                entry_points={PROVIDERS: {null.NAME: null.PROVIDER_ENTRY},
                                              ENGINES: {null.NAME: null.ENGINE_ENTRY}})
