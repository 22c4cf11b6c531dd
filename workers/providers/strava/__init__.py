"""The Strava provider: API client, usage headers and windows, mapping, dataset-1 archive."""

# The registry names ``workers.providers.strava.provider:StravaProvider`` by path; this module imports
# nothing, so ``from workers.providers.strava import client`` inside the provider is no cycle.

from __future__ import annotations
