"""The Strava provider: API client, usage headers, mapping, dataset-1 archive.

``StravaProvider`` (in ``provider.py``) is the only name the rest of
Switchyard needs; the registry imports it lazily.
"""

from __future__ import annotations

from workers.providers.strava.provider import StravaProvider

__all__ = ["StravaProvider"]
