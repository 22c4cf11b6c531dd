"""The Strava provider: API client, usage headers and windows, mapping, dataset-1 archive.

``StravaProvider`` (in ``provider.py``) is the only name the rest of
Switchyard needs, and the registry imports it by path
(``workers.providers.strava.provider:StravaProvider``). This package module
imports nothing, so ``from workers.providers.strava import client`` inside the
provider is no import cycle.
"""

from __future__ import annotations
