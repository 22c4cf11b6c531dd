"""Provider lookup by name: adding a provider is one sub-package and one line here.

Why import paths and not imports: the bridge and the tasks resolve the
provider from configuration (``CAIRN_PROVIDER``) and must not import every
provider's dependencies. Third-party providers can also register through the
``switchyard.providers`` entry-point group without touching this file.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from workers.errors import ConfigError
from workers.providers.base import Provider

ENTRY_POINT_GROUP = "switchyard.providers"

# name → "module:Class"; the class needs a ``from_settings(settings)`` classmethod.
PROVIDERS: dict[str, str] = {
    "strava": "workers.providers.strava.provider:StravaProvider",
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


def get_provider(name: str, settings: Any = None) -> Provider:
    """Build the provider ``name``; ``settings`` is passed to its ``from_settings``."""
    module_name, _, attr = _target(name.strip().lower()).partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    provider = cls.from_settings(settings) if hasattr(cls, "from_settings") else cls()
    if not isinstance(provider, Provider):
        raise ConfigError(f"CAIRN_PROVIDER: {name!r} does not implement the Provider interface")
    return provider
