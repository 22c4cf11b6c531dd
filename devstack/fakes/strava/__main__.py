"""``python -m devstack.fakes.strava``: the fake Strava standalone, for manual use."""

from __future__ import annotations

import threading

from devstack.fakes.strava.api import FakeStrava

DEMO_ATHLETE_ID = 1001


def main() -> None:  # pragma: no cover - manual use
    """Run standalone: prints the base URL and one athlete's token."""
    strava = FakeStrava().start()
    ath = strava.add_athlete(DEMO_ATHLETE_ID)
    print(f"fake Strava on {strava.base_url}; athlete {DEMO_ATHLETE_ID} access token {ath.access_token}",
          flush=True)
    try:
        threading.Event().wait()
    finally:
        strava.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
