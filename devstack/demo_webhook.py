"""The demo's webhook path: a new Strava upload travels fake Strava → core HTTP → NATS → pool → core.

Hooked into ``devstack/demo.py`` at two points: :func:`fleet_env` adds the
pool's verify token to the fleet's environment, and :func:`run` (after the
main summary) does what an operator and an athlete would:

1. start the dev core's ``/webhooks/<worker_key>`` endpoint on loopback;
2. register the fake Strava app's push subscription against it (Strava's
   handshake is relayed by core to the pool's verify responder, so this waits
   until the fleet's bridge answers);
3. create an activity in the fake Strava, which pushes its ``create`` event;
4. wait until core has ingested that activity and print the time from the
   push to the ingest, with the kinds of events it carried (activity, and
   segments/efforts and attachments where the provider emits them).
"""

from __future__ import annotations

import secrets
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from devstack.fakes.provider_fake import Connected
from workers.cairn.contract import subjects

PROVIDER = "strava"  # the leg is the fake Strava app's push subscription
ENV_VERIFY_TOKEN = "CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN"
SUBSCRIBE_DEADLINE_S = 60.0  # the bridge may still be starting
SUBSCRIBE_RETRY_S = 0.5
INGEST_DEADLINE_S = 60.0
POLL_S = 0.02
TOKEN_BYTES = 16
DEMO_PHOTOS = 1
DEMO_SEGMENTS = 2

_TOKEN = secrets.token_urlsafe(TOKEN_BYTES)


def fleet_env() -> dict[str, str]:
    """The pool takes webhooks only with a verify token (never printed)."""
    return {ENV_VERIFY_TOKEN: _TOKEN}


def _subscribe(strava: Any, callback: str) -> int:
    deadline = time.monotonic() + SUBSCRIBE_DEADLINE_S
    last = ""
    while time.monotonic() < deadline:
        resp = httpx.post(strava.api_url + "/push_subscriptions",
                          data={"client_id": strava.client_id, "client_secret": strava.client_secret,
                                "callback_url": callback, "verify_token": _TOKEN}, timeout=10.0)
        if resp.status_code == 201:
            return int(resp.json()["id"])
        last = f"HTTP {resp.status_code}"
        time.sleep(SUBSCRIBE_RETRY_S)  # the pool's verify responder is not up yet: nothing to await
    raise RuntimeError(f"the push subscription was not validated within {SUBSCRIBE_DEADLINE_S:.0f}s ({last})")


def _results_for(core: Any, activity_id: int) -> list[Any]:
    return [r for r in core.ingested if r.kind in ("events", "segments") and r.msg_id
            and f":{activity_id}:" in r.msg_id]


def _event_kinds(results: list[Any]) -> str:
    kinds: Counter[str] = Counter()
    for r in results:
        for ev in r.data.get("events", []):
            kinds.update(k for k in ev if k not in ("type", "ref"))
            kinds["attachment"] += len((ev.get("activity") or {}).get("attachments") or [])
    return ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()) if n) or "none"


def run_for(core: Any, connected: Sequence[Connected], kits: Mapping[str, Any]) -> int:
    """The webhook leg on the first Strava pool the demo connected an account on; none without one."""
    account = next((c for c in connected if c.pool.provider == PROVIDER), None)
    if account is None:
        print(f"WEBHOOK status=skipped reason=no {PROVIDER} pool")
        return 0
    return run(core, kits[PROVIDER].fake, int(account.account.external_id or 0), account.pool.worker_name)


def run(core: Any, strava: Any, athlete_id: int, worker_name: str, provider: str = PROVIDER) -> int:
    """The webhook leg of the demo; prints one ``WEBHOOK`` line, returns 0 when the activity was ingested."""
    print("\n== webhook ==")
    callback = core.start_webhooks_http().url(subjects.worker_key(worker_name, provider))
    try:
        sub_id = _subscribe(strava, callback)
    except RuntimeError as exc:
        print(f"WEBHOOK status=failed reason={exc}")
        return 1
    print(f"  push subscription {sub_id} validated by the pool → {callback}")
    started = time.monotonic()
    act = strava.create_activity(athlete_id, photos=DEMO_PHOTOS, segments=DEMO_SEGMENTS)
    expected = 2  # the activity, then its segments and efforts in a second result (``…:seg``)
    print(f"  created activity {act['id']} ({act.get('sport_type', '?')}, {DEMO_PHOTOS} photo, "
          f"{DEMO_SEGMENTS} segment efforts) in fake Strava; create event pushed")
    deadline = started + INGEST_DEADLINE_S
    while time.monotonic() < deadline and len(_results_for(core, act["id"])) < expected:
        time.sleep(POLL_S)  # core's ingest list has no event to await from here
    elapsed_ms = (time.monotonic() - started) * 1000
    results = _results_for(core, act["id"])
    if len(results) < expected:
        print(f"WEBHOOK status=failed reason=activity {act['id']} not ingested within {INGEST_DEADLINE_S:.0f}s")
        return 1
    print(f"  ingested: {_event_kinds(results)}")
    print(f"WEBHOOK status=ok webhook_to_ingest_ms={elapsed_ms:.0f}")
    return 0
