"""Provider lookup by name: built-in providers here, any other through an entry point."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from workers.errors import ConfigError
from workers.providers.base import Provider
from workers.providers.models import PoolIdentity

ENTRY_POINT_GROUP = "switchyard.providers"

# name → "module:Class" of a ``Provider`` subclass, built with ``Class.from_settings(settings, pool)``.
PROVIDERS: dict[str, str] = {
    "strava": "workers.providers.strava.provider:StravaProvider",
    "garmin": "workers.providers.garmin.provider:GarminProvider",
}


def provider_names() -> list[str]:
    """Every provider this installation can build (built-in and entry points)."""
    names = set(PROVIDERS)
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def _target(name: str) -> str:
    if name in PROVIDERS:
        return PROVIDERS[name]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.value
    raise ConfigError(f"CAIRN_PROVIDER: unknown provider {name!r} (known: {', '.join(provider_names())})")


def provider_class(name: str) -> type[Provider]:
    """The ``Provider`` subclass registered as ``name``; ConfigError for anything else.

    Resolved by import path, so a process imports only its own provider's dependencies. A
    provider in its own distribution registers in the ``switchyard.providers`` entry-point
    group and touches no module here (docs/DESIGN.md has the recipe).
    """
    module_name, _, attr = _target(name.strip().lower()).partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Provider)):
        raise ConfigError(f"CAIRN_PROVIDER: {name!r} does not implement the Provider interface")
    return cls


def get_provider(name: str, settings: Any = None) -> Provider:
    """Build the provider ``name`` for the pool ``settings`` (its ``CairnSettings``) describe."""
    return provider_class(name).from_settings(settings, PoolIdentity.of(settings))
