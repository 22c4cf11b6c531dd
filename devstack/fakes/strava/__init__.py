"""The fake Strava (API v3, OAuth, webhooks, photo CDN): a dev double of an external system.

One sub-package per fake provider, so a second provider's fake (``devstack/fakes/garmin/``)
is this one's sibling. ``api`` is the HTTP surface and the ``FakeStrava`` facade tests drive;
the state behind it lives next door, one concept each: ``data`` (deterministic athletes),
``limits`` (usage windows, headers, 429s), ``oauth`` (apps, codes, tokens), ``media`` (photos,
CDN, extra segment efforts) and ``push`` (push subscriptions and events).
``python -m devstack.fakes.strava`` runs it standalone.
"""

from __future__ import annotations

from devstack.fakes.strava.api import (
                                        ACCESS_TOKEN_TTL_S,
                                        API_PREFIX,
                                        DAY_S,
                                        DEFAULT_CLIENT_ID,
                                        DEFAULT_LIMITS,
                                        DEFAULT_PER_PAGE,
                                        DEFAULT_READ_LIMITS,
                                        DEFAULT_SCOPE,
                                        ENDPOINTS,
                                        MAX_PER_PAGE,
                                        REFRESH_REISSUE_WINDOW_S,
                                        SHORT_WINDOW_S,
                                        FakeAthlete,
                                        FakeStrava,
                                        RequestRecord,
)

__all__ = ["ACCESS_TOKEN_TTL_S", "API_PREFIX", "DAY_S", "DEFAULT_CLIENT_ID", "DEFAULT_LIMITS", "DEFAULT_PER_PAGE",
           "DEFAULT_READ_LIMITS", "DEFAULT_SCOPE", "ENDPOINTS", "MAX_PER_PAGE", "REFRESH_REISSUE_WINDOW_S",
           "SHORT_WINDOW_S", "FakeAthlete", "FakeStrava", "RequestRecord"]
