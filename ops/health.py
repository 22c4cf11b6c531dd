"""``switchyard health``: one verdict on a *running* fleet, from what the fleet records (invariant H1).

The doctor (``ops.doctor``) checks a host's configuration; this checks that
the deployment it configures is up and doing its duties, from the records the
processes keep themselves, never by asking them:

* ``redis`` and ``nats``: this host reaches ``REDIS_URL`` (Sentinel included) and
  ``CAIRN_NATS_URL`` (with the pool's credentials, JetStream answering), and no
  Cairn bridge reports its own NATS connection down;
* ``pool gpu`` / ``pool io`` / ``pool provider``: a Celery worker consumes each queue
  the configured sides need (``workers.liveness`` records, ``tasks.registration``);
* ``beat lock``: a beat holds the RedBeat lock (``tasks.scheduler``);
* ``voicy bridge``: a Voicy bridge is polling (its liveness record says ``ok``);
* ``cairn presence``: every provider worker's presence record is live for core
  (``last_seen`` within ``CAIRN_PRESENCE_LIVE_S``, core's 45 s), at least one is,
  and each has the ``webhooks`` flag the pool's configuration implies;
* ``cairn manifest``: the pool's manifest is younger than ``CAIRN_MANIFEST_MAX_AGE_S`` (15 min);
* ``cairn consumers``: every durable the pool needs (``bridges.cairn.consumers``,
  plus the webhook consumer when webhooks are on) exists and a live bridge pulls it;
* ``faults``: no permanent fault is recorded (``workers.faults``).

Which parts apply comes from the same configuration the fleet runs with: the
Voicy parts when ``VOICY_WORKER_API_URL`` is set, the Cairn parts when
``CAIRN_NATS_URL`` is. A part whose service is unreachable is skipped, naming
it, so one outage is one FAIL line. Every network call has a timeout.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import UTC, datetime
from typing import Any, TextIO

import nats
from nats.js.errors import NoKeysError, NotFoundError
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from bridges.cairn.consumers import JobConsumer, pool_consumers
from bridges.cairn.webhooks import webhook_consumer
from ops.doctor import FAIL, OK, SKIP, Check
from workers import faults, liveness
from workers.cairn import subjects
from workers.cairn.nats_conn import connect_options
from workers.cairn.settings import CairnSettings, load_cairn_settings
from workers.cairn.webhooks import webhooks_enabled
from workers.config import load_settings
from workers.errors import ConfigError
from workers.logs import redact, setup_logging
from workers.providers.registry import get_provider
from workers.redisconn import sync_client

DEFAULT_TIMEOUT_S = 5.0  # each network call: Redis, the NATS connect, each JetStream request
PRESENCE_LIVE_S = 45.0  # core counts a presence record live this long (reference/cairn.md §2.10)
MANIFEST_MAX_AGE_S = 900.0  # the manifest bucket's TTL (contract §1): older is gone for core
REDBEAT_KEY_PREFIX = "redbeat:"  # RedBeat's default; its lock is ``<prefix>:lock``
QUEUES_VOICY = ("gpu", "io")
QUEUES_CAIRN = ("provider",)
DETAIL_MAX_CHARS = 400
NATS_RETRY_WAIT_S = 0.1


class HealthSettings(BaseSettings):
    """The verdict's windows; tests shorten them, operators normally leave them alone."""

    model_config = SettingsConfigDict(env_prefix="CAIRN_", extra="ignore", env_ignore_empty=True)

    presence_live_s: float = Field(default=PRESENCE_LIVE_S, gt=0)
    manifest_max_age_s: float = Field(default=MANIFEST_MAX_AGE_S, gt=0)


def _part(name: str, problems: list[str], ok_detail: str) -> Check:
    if problems:
        return Check(name, FAIL, redact("; ".join(problems))[:DETAIL_MAX_CHARS])
    return Check(name, OK, ok_detail)


def _names(records: list[liveness.ProcessRecord]) -> str:
    return ", ".join(r.name for r in records)


# --- Redis: the records ---------------------------------------------------------------------------
def beat_lock(client: Any, app: Any) -> Check:
    prefix = app.conf.get("redbeat_key_prefix") or REDBEAT_KEY_PREFIX
    key = app.conf.get("redbeat_lock_key") or f"{prefix}:lock"
    ttl_ms = int(client.pttl(key))
    if ttl_ms == -2:
        return Check("beat lock", FAIL, f"no beat holds the RedBeat lock {key}: beat is not running "
                                        "(start the beat process, one per deployment)")
    expiry = f" (expires in {ttl_ms / 1000:.0f}s unless renewed)" if ttl_ms > 0 else ""
    return Check("beat lock", OK, f"{key} held{expiry}")


def pools(workers: list[liveness.ProcessRecord], queues: tuple[str, ...]) -> list[Check]:
    checks = []
    for queue in queues:
        consuming = [w for w in workers if queue in w.queues]
        checks.append(_part(f"pool {queue}", [] if consuming else
                            [f"no Celery worker consumes queue {queue}: start the {queue} process "
                             f"(celery -A tasks worker -Q {queue})"],
                            f"{len(consuming)} worker(s): {_names(consuming)}"))
    return checks


def voicy_bridge(records: list[liveness.ProcessRecord]) -> Check:
    if not records:
        return Check("voicy bridge", FAIL, "no Voicy bridge is polling (no live record): start "
                                           "python -m bridges voicy")
    stuck = [f"{r.name}: {r.state}" for r in records if not r.ok]
    return _part("voicy bridge", stuck, f"{len(records)} polling: {_names(records)}")


def recorded_faults(client: Any) -> Check:
    found = faults.read_faults(client)
    problems = [f"{f.component}: {f.detail} (since {datetime.fromtimestamp(f.at, UTC):%Y-%m-%d %H:%M:%S} UTC)"
                for f in found]
    return _part("faults", problems, "none recorded")


# --- NATS: the pool as core sees it -----------------------------------------------------------------
def _age_s(stamp: Any, now: float) -> float | None:
    try:
        return now - datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


async def _kv_records(js: Any, bucket: str, prefix: str, timeout_s: float) -> dict[str, dict[str, Any]]:
    kv = await asyncio.wait_for(js.key_value(bucket), timeout_s)
    try:
        keys = await asyncio.wait_for(kv.keys(), timeout_s)
    except NoKeysError:  # an empty bucket
        keys = []
    found: dict[str, dict[str, Any]] = {}
    for key in keys:
        if key == prefix or key.startswith(prefix + "."):
            entry = await asyncio.wait_for(kv.get(key), timeout_s)
            try:
                found[key] = json.loads(entry.value or b"{}")
            except ValueError:
                found[key] = {}
    return found


async def presence(js: Any, settings: CairnSettings, live_s: float, provider_workers: list[liveness.ProcessRecord],
                   webhooks: bool, timeout_s: float) -> Check:
    now, pool = time.time(), settings.worker_name
    records = await _kv_records(js, subjects.PRESENCE_BUCKET, pool, timeout_s)
    ages = {key.removeprefix(pool + "."): _age_s(r.get("last_seen"), now) for key, r in records.items()}
    live = {iid: records[subjects.presence_key(pool, iid)] for iid, age in ages.items()
            if age is not None and age <= live_s}
    problems = []
    if not live:
        seen = [f"{iid} {age:.0f}s ago" for iid, age in ages.items() if age is not None]
        problems.append(f"no live presence record for pool {pool} (core counts {live_s:.0f}s)"
                        + (f"; last seen: {', '.join(seen)}" if seen else ""))
    silent = [w.name for w in provider_workers if w.cairn_instance is None]
    if silent:
        problems.append(f"provider worker(s) {', '.join(silent)} write no presence (is CAIRN_NATS_URL set there?)")
    missing = [w.cairn_instance for w in provider_workers if w.cairn_instance and w.cairn_instance not in live]
    if missing:
        problems.append(f"provider instance(s) {', '.join(missing)} run but their presence is not live: "
                        "see that worker's log (presence write failed ...)")
    wrong = sorted(iid for iid, record in live.items() if bool(record.get("webhooks")) != webhooks)
    if wrong:
        why = "webhooks are on (a verify token is set)" if webhooks else "webhooks are off"
        problems.append(f"{', '.join(wrong)} report webhooks={str(not webhooks).lower()} but {why}"
                        + ("; is the webhook consumer there?" if webhooks else ""))
    return _part("cairn presence", problems,
                 f"{len(live)} live instance(s), webhooks={str(webhooks).lower()}: {', '.join(sorted(live))}")


async def manifest(js: Any, settings: CairnSettings, max_age_s: float, timeout_s: float) -> Check:
    records = await _kv_records(js, subjects.MANIFEST_BUCKET, settings.worker_name, timeout_s)
    record = records.get(settings.worker_name)
    if record is None:
        return Check("cairn manifest", FAIL, f"no manifest for pool {settings.worker_name}: a provider worker "
                                             "writes it at start and beat every 10 min")
    age = _age_s(record.get("updated_at"), time.time())
    if age is None or age > max_age_s:
        return Check("cairn manifest", FAIL, f"manifest of {settings.worker_name} is stale "
                     f"({'unreadable updated_at' if age is None else f'{age:.0f}s old'}, limit {max_age_s:.0f}s): "
                     "is beat running?")
    return Check("cairn manifest", OK, f"updated {age:.0f}s ago")


def needed_consumers(settings: CairnSettings) -> list[JobConsumer]:
    """The pool's job durables, and its webhook durable when webhooks are on (as the bridge makes them)."""
    needed = pool_consumers(settings, get_provider(settings.provider, settings))
    if webhooks_enabled(settings.provider):
        needed.append(webhook_consumer(settings))
    return needed


async def consumers(js: Any, settings: CairnSettings, bridges: list[liveness.ProcessRecord] | None,
                    timeout_s: float) -> Check:
    needed = needed_consumers(settings)
    missing = []
    for consumer in needed:
        try:
            await asyncio.wait_for(js.consumer_info(consumer.stream, consumer.durable), timeout_s)
        except NotFoundError:
            missing.append(consumer.durable)
    problems = []
    if missing:
        problems.append(f"missing: {', '.join(missing)} (the cairn bridge creates them at start: restart it)")
    if bridges is None:
        return _part("cairn consumers", problems, f"{len(needed)} exist (whether a bridge pulls them needs Redis)")
    if not bridges:
        problems.append(f"no cairn bridge of pool {settings.worker_name} is running: start python -m bridges cairn")
    else:
        pulled = {durable for b in bridges for durable in b.pulling}
        unpulled = [c.durable for c in needed if c.durable not in pulled and c.durable not in missing]
        if unpulled:
            problems.append(f"not pulled by any bridge: {', '.join(unpulled)} (see the cairn bridge's log)")
    return _part("cairn consumers", problems, f"{len(needed)} bound, pulled by {_names(bridges or [])}")


async def _quiet(exc: Exception) -> None:
    """nats-py's default error callback logs a traceback per failed attempt; the part's line says enough."""


async def cairn_parts(settings: CairnSettings, windows: HealthSettings, workers: list[liveness.ProcessRecord] | None,
                      bridges: list[liveness.ProcessRecord] | None, timeout_s: float) -> list[Check]:
    after = ("cairn presence", "cairn manifest", "cairn consumers")
    # nats-py counts max_reconnect_attempts=0 as unlimited: one retry, then NoServersError.
    options = {**connect_options(settings), "allow_reconnect": False, "max_reconnect_attempts": 1,
               "reconnect_time_wait": NATS_RETRY_WAIT_S, "connect_timeout": timeout_s, "error_cb": _quiet}
    try:
        nc = await asyncio.wait_for(nats.connect(**options), timeout_s)
    except Exception as exc:  # noqa: BLE001 - any connect failure is this part's answer
        reason = "timed out" if isinstance(exc, asyncio.TimeoutError) else type(exc).__name__
        return [Check("nats", FAIL, f"cannot connect to CAIRN_NATS_URL ({reason}); check the URL and "
                                    "CAIRN_WORKER_ENROLLMENT_TOKEN / CAIRN_NATS_*")] + \
            [Check(name, SKIP, "needs NATS") for name in after]
    try:
        js = nc.jetstream(timeout=timeout_s)
        try:
            await asyncio.wait_for(js.account_info(), timeout_s)
        except Exception as exc:  # noqa: BLE001 - JetStream off or not answering
            return [Check("nats", FAIL, f"connected, but JetStream does not answer ({type(exc).__name__})")] + \
                [Check(name, SKIP, "needs JetStream") for name in after]
        down = [b.name for b in bridges or [] if b.nats_connected is False]
        nats_part = _part("nats", [f"cairn bridge {', '.join(down)} reports its NATS connection down"] if down
                          else [], "reachable, JetStream answers")
        provider_workers = [w for w in workers or [] if QUEUES_CAIRN[0] in w.queues]
        return [nats_part] + [await _guarded(name, coro) for name, coro in (
            ("cairn presence", presence(js, settings, windows.presence_live_s, provider_workers,
                                        webhooks_enabled(settings.provider), timeout_s)),
            ("cairn manifest", manifest(js, settings, windows.manifest_max_age_s, timeout_s)),
            ("cairn consumers", consumers(js, settings, bridges, timeout_s)))]
    finally:
        await nc.close()


async def _guarded(name: str, coro: Any) -> Check:
    try:
        return await coro
    except Exception as exc:  # noqa: BLE001 - a bucket or stream missing, a request timing out: one line
        return Check(name, FAIL, redact(f"{type(exc).__name__}: {exc}")[:DETAIL_MAX_CHARS] or type(exc).__name__)


# --- the verdict ----------------------------------------------------------------------------------
def verdict(timeout_s: float = DEFAULT_TIMEOUT_S, clear: bool = False) -> list[Check]:
    """Every part of the verdict, in the order it prints."""
    try:
        # Here, not at the top: importing tasks reads the fleet's settings, and a bad value
        # must be this verdict's FAIL line, not a traceback of the command.
        from tasks import app
        from tasks.settings import FleetSettings

        fleet = load_settings(FleetSettings)
        windows = load_settings(HealthSettings)
        cairn = load_cairn_settings() if os.environ.get("CAIRN_NATS_URL") else None
    except ConfigError as exc:
        return [Check("settings", FAIL, str(exc))]
    voicy_on = bool(os.environ.get("VOICY_WORKER_API_URL"))
    queues = (QUEUES_VOICY if voicy_on else ()) + (QUEUES_CAIRN if cairn is not None else ())
    client = sync_client(fleet.redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    workers = bridges = None
    try:
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any Redis failure is this part's answer
        checks = [Check("redis", FAIL, f"cannot reach REDIS_URL ({type(exc).__name__}); nothing of the fleet "
                                       "works without it")]
        names = ["beat lock", *(f"pool {q}" for q in queues), *(["voicy bridge"] if voicy_on else []), "faults"]
        checks += [Check(name, SKIP, "needs Redis") for name in names]
    else:
        if clear:
            faults.clear_faults(client)
        workers = liveness.read(client, liveness.WORKER)
        if cairn is not None:  # several Cairn pools may share this Redis: only this pool's provider workers
            workers = [w for w in workers if QUEUES_CAIRN[0] not in w.queues or w.pool in (None, cairn.worker_name)]
        checks = [Check("redis", OK, "reachable"), beat_lock(client, app), *pools(workers, queues)]
        if voicy_on:
            checks.append(voicy_bridge(liveness.read(client, liveness.VOICY_BRIDGE)))
        if cairn is not None:
            bridges = [b for b in liveness.read(client, liveness.CAIRN_BRIDGE) if b.pool == cairn.worker_name]
        checks.append(recorded_faults(client))
    finally:
        client.close()
    if cairn is not None:
        checks += asyncio.run(cairn_parts(cairn, windows, workers, bridges, timeout_s))
    return checks


def run(out: TextIO, timeout_s: float = DEFAULT_TIMEOUT_S, clear: bool = False) -> int:
    """Print one line per part and the verdict; 0 when healthy, 1 otherwise."""
    setup_logging("WARNING")
    checks = verdict(timeout_s, clear)
    for check in checks:
        print(check.line(), file=out, flush=True)
    failing = [c.name for c in checks if c.failed]
    print(f"UNHEALTHY: {', '.join(failing)}" if failing else f"HEALTHY: {len(checks)} parts checked", file=out)
    return 1 if failing else 0
