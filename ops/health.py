"""``switchyard health``: one verdict on a *running* fleet, from what the fleet records (invariant H1)."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any, TextIO

import nats
from nats.js.errors import NotFoundError
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from bridges.cairn.consumers import JobConsumer, pool_consumers
from bridges.cairn.webhooks import webhook_consumer
from ops.doctor import FAIL, OK, SKIP, Check
from workers import faults, liveness
from workers.cairn.contract import subjects
from workers.cairn.handlers.webhooks import enabled as webhooks_enabled
from workers.cairn.nats_conn import connect_options
from workers.cairn.settings import POOL_CREDENTIALS, CairnSettings, load_cairn_settings, pool_variable
from workers.config import load_settings
from workers.errors import ConfigError
from workers.logs import redact, setup_logging
from workers.providers.registry import get_provider
from workers.redisconn import shown_url, sync_client, tls_failure

DEFAULT_TIMEOUT_S = 5.0  # each network call: Redis, the NATS connect, each JetStream request
PRESENCE_LIVE_S = 45.0  # core counts a presence record live this long (reference/cairn.md §2.10)
MANIFEST_MAX_AGE_S = 900.0  # the manifest bucket's TTL (contract §1): older is gone for core
REDBEAT_KEY_PREFIX = "redbeat:"  # RedBeat's default; its lock is ``<prefix>:lock``
QUEUES_VOICY = ("gpu", "io")
PROVIDER_QUEUE_PREFIX = "provider."  # a pool's queue is provider.<worker_name> (tasks.routes)
DETAIL_MAX_CHARS = 400
NATS_RETRY_WAIT_S = 0.1
HEALTHY, UNHEALTHY, UNVERIFIED = "HEALTHY: ", "UNHEALTHY: ", "UNVERIFIED: "  # the verdict line's prefixes


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
    problems = [f"{f.component}: {f.detail} (since {f.at:%Y-%m-%d %H:%M:%S} UTC)" for f in faults.read_faults(client)]
    return _part("faults", problems, "none recorded")


def clear_faults(client: Any) -> None:
    """``--clear-faults``: the operator fixed the causes; a fault that persists is recorded again."""
    for fault in faults.read_faults(client):
        faults.clear_fault(client, fault.component)


def pool_webhooks(pool: str, bridges: list[liveness.ProcessRecord]) -> bool | None:
    """Whether the pool runs with webhooks, as its own bridges say: they serve its webhook durable or not.

    The fleet's records, never the asker's environment: an operator's shell without the pool's verify
    token must not turn a fleet that takes webhooks into a FAIL. None when no bridge record says.
    """
    durable = subjects.webhook_durable_name(pool)
    flags = {durable in b.durables for b in bridges if b.durables}
    return flags.pop() if len(flags) == 1 else None


def presence(pool: str, provider_workers: list[liveness.ProcessRecord], live_s: float,
             bridges: list[liveness.ProcessRecord] | None = None) -> Check:
    """Each provider worker notes when its presence write was acknowledged, and the ``webhooks`` flag it
    wrote; that flag must match what the pool's bridges run (:func:`pool_webhooks`), and each other."""
    bridges = bridges or []
    now = time.time()
    live = [w for w in provider_workers if w.presence_at is not None and now - w.presence_at <= live_s]
    problems = []
    if not live:
        seen = [f"{w.name} {now - w.presence_at:.0f}s ago" for w in provider_workers if w.presence_at is not None]
        problems.append(f"no live presence for pool {pool} (core counts {live_s:.0f}s)"
                        + (f"; last written: {', '.join(seen)}" if seen else ""))
    silent = [w.name for w in provider_workers if w.cairn_instance is None]
    if silent:
        problems.append(f"provider worker(s) {', '.join(silent)} write no presence (is CAIRN_NATS_URL set there?)")
    stale = [w.name for w in provider_workers if w.cairn_instance is not None and w not in live]
    if stale and live:
        problems.append(f"{', '.join(stale)} run but their presence is not live: see that worker's log "
                        "(presence write failed ...)")
    expected = pool_webhooks(pool, bridges)
    durable = subjects.webhook_durable_name(pool)
    split = sorted(b.name for b in bridges if b.durables and durable in b.durables)
    if expected is None and split and len(split) < len([b for b in bridges if b.durables]):
        problems.append(f"the pool's bridges disagree on webhooks: only {', '.join(split)} serve {durable}; "
                        "give every process of the pool the same webhook settings")
    flags = {w.presence_webhooks for w in live}
    if expected is not None:
        wrong = [w.name for w in live if w.presence_webhooks is not expected]
        if wrong:
            why = f"the pool's bridge serves {durable}" if expected else "the pool's bridge serves no webhook durable"
            problems.append(f"{', '.join(wrong)} report webhooks={str(not expected).lower()} but {why}: give "
                            "the provider and cairn_bridge processes the same webhook settings (verify token)")
    elif len(flags) > 1:
        problems.append("the pool's instances disagree on webhooks: " + ", ".join(
            f"{w.name} webhooks={str(w.presence_webhooks).lower()}" for w in live))
    shown = expected if expected is not None else (next(iter(flags)) if len(flags) == 1 else None)
    flag = "unknown" if shown is None else str(shown).lower()
    return _part(f"cairn presence {pool}", problems,
                 f"{len(live)} live instance(s), webhooks={flag}: " + ", ".join(str(w.cairn_instance) for w in live))


def manifest(pool: str, provider_workers: list[liveness.ProcessRecord], max_age_s: float) -> Check:
    """Any provider worker of the pool writes the manifest (at its start, then every 10 min): the latest counts."""
    written = max((w.manifest_at for w in provider_workers if w.manifest_at is not None), default=None)
    if written is None:
        return Check(f"cairn manifest {pool}", FAIL, f"no provider worker of pool {pool} has written its manifest: "
                                             "each writes it at start, then every 10 min (see their logs)")
    age = time.time() - written
    if age > max_age_s:
        return Check(f"cairn manifest {pool}", FAIL, f"manifest of {pool} written {age:.0f}s ago "
                                                     f"(limit {max_age_s:.0f}s): see the provider workers' logs "
                                                     "(manifest write failed ...)")
    return Check(f"cairn manifest {pool}", OK, f"written {age:.0f}s ago")


# --- NATS: what the pool's own login may ask ------------------------------------------------------
def needed_consumers(settings: CairnSettings, webhooks: bool | None = None) -> list[JobConsumer]:
    """The pool's job durables, and its webhook durable when webhooks are on (as the bridge makes them):
    ``webhooks`` as the pool's bridges say (:func:`pool_webhooks`), else as this environment configures."""
    provider = get_provider(settings.provider, settings)
    needed = pool_consumers(settings, provider)
    if webhooks if webhooks is not None else webhooks_enabled(provider.webhook_rules()):
        needed.append(webhook_consumer(settings))
    return needed


async def consumers(js: Any, settings: CairnSettings, bridges: list[liveness.ProcessRecord] | None,
                    timeout_s: float) -> Check:
    needed = needed_consumers(settings, pool_webhooks(settings.worker_name, bridges or []))
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
        return _part(f"cairn consumers {settings.worker_name}", problems,
                     f"{len(needed)} exist (whether a bridge pulls them needs Redis)")
    if not bridges:
        problems.append(f"no cairn bridge of pool {settings.worker_name} is running: start python -m bridges cairn")
    else:
        pulled = {durable for b in bridges for durable in b.pulling}
        unpulled = [c.durable for c in needed if c.durable not in pulled and c.durable not in missing]
        if unpulled:
            problems.append(f"not pulled by any bridge: {', '.join(unpulled)} (see the cairn bridge's log)")
    return _part(f"cairn consumers {settings.worker_name}", problems,
                 f"{len(needed)} bound, pulled by {_names(bridges or [])}")


async def _quiet(exc: Exception) -> None:
    """nats-py's default error callback logs a traceback per failed attempt; the part's line says enough."""


async def nats_parts(settings: CairnSettings, bridges: list[liveness.ProcessRecord] | None,
                     timeout_s: float) -> list[Check]:
    """``nats <pool>`` (this host connects as the pool, JetStream answers, no bridge of the pool reports
    NATS down) and ``cairn consumers <pool>``."""
    pool = settings.worker_name
    # nats-py counts max_reconnect_attempts=0 as unlimited: one retry, then NoServersError.
    options = {**connect_options(settings), "allow_reconnect": False, "max_reconnect_attempts": 1,
               "reconnect_time_wait": NATS_RETRY_WAIT_S, "connect_timeout": timeout_s, "error_cb": _quiet}
    try:
        nc = await asyncio.wait_for(nats.connect(**options), timeout_s)
    except Exception as exc:  # noqa: BLE001 - any connect failure is this part's answer
        reason = "timed out" if isinstance(exc, asyncio.TimeoutError) else type(exc).__name__
        return [Check(f"nats {pool}", FAIL, f"cannot connect to CAIRN_NATS_URL as pool {pool} ({reason}); check "
                                            "the URL and the pool's CAIRN_WORKER_ENROLLMENT_TOKEN / CAIRN_NATS_*"),
                Check(f"cairn consumers {pool}", SKIP, "needs NATS")]
    try:
        js = nc.jetstream(timeout=timeout_s)
        try:  # the presence bucket's stream info: what core's worker template grants
            await asyncio.wait_for(js.key_value(subjects.PRESENCE_BUCKET), timeout_s)
        except Exception as exc:  # noqa: BLE001 - JetStream off, core's buckets missing, not answering
            return [Check(f"nats {pool}", FAIL, f"connected, but JetStream does not show core's "
                                                f"{subjects.PRESENCE_BUCKET} bucket ({type(exc).__name__}): "
                                                "is core running on this NATS?"),
                    Check(f"cairn consumers {pool}", SKIP, "needs JetStream")]
        down = [b.name for b in bridges or [] if b.nats_connected is False]
        nats_part = _part(f"nats {pool}", [f"cairn bridge {', '.join(down)} reports its NATS connection down"]
                          if down else [], "reachable, JetStream answers")
        return [nats_part, await _guarded(f"cairn consumers {pool}", consumers(js, settings, bridges, timeout_s))]
    finally:
        await nc.close()


async def _guarded(name: str, coro: Any) -> Check:
    try:
        return await coro
    except Exception as exc:  # noqa: BLE001 - a bucket or stream missing, a request timing out: one line
        return Check(name, FAIL, redact(f"{type(exc).__name__}: {exc}")[:DETAIL_MAX_CHARS] or type(exc).__name__)


# --- the verdict ----------------------------------------------------------------------------------
def verdict(timeout_s: float = DEFAULT_TIMEOUT_S, clear: bool = False) -> list[Check]:
    """Every part of the verdict, in the order it prints.

    Fail closed: the parts are those the fleet's own liveness records say exist (Voicy's pools and
    bridge, every Cairn pool a worker or bridge names), plus those this environment configures. A
    part that cannot be checked from here (its service unreachable, no ``CAIRN_NATS_URL``, no login of
    that pool) is a ``skip`` line saying why, and a verdict with one is not healthy (:func:`run`).
    Presence and the manifest are judged from what the workers noted in Redis: the pool's own NATS
    login may write them but not read them back (contract §1).
    """
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
    client = sync_client(fleet.redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        try:
            client.ping()
        except Exception as exc:  # noqa: BLE001 - any Redis failure is this part's answer
            names = ["beat lock", *(f"pool {q}" for q in QUEUES_VOICY if voicy_on),
                     *(["voicy bridge"] if voicy_on else []), "faults"]
            url, tls = shown_url(fleet.redis_url), tls_failure(exc)
            why = f"REDIS_URL {url}: {tls}" if tls else f"cannot reach REDIS_URL {url} ({type(exc).__name__})"
            checks = [Check("redis", FAIL, f"{why}; nothing of the fleet works without it"),
                      *(Check(name, SKIP, "needs Redis") for name in names)]
            pools_seen: dict[str, PoolView] = {}
        else:
            if clear:
                clear_faults(client)
            checks, pools_seen = _redis_parts(client, app, windows, cairn, voicy_on)
    finally:
        client.close()
    for pool, part in pools_seen.items():
        skipped = _nats_unchecked(pool, cairn)
        if skipped:
            checks += [Check(f"{name} {pool}", SKIP, skipped) for name in ("nats", "cairn consumers")]
            continue
        try:
            settings = cairn if cairn is not None and pool == cairn.worker_name else \
                load_cairn_settings(worker_name=pool, provider=part.provider)
        except ConfigError as exc:
            checks += [Check(f"nats {pool}", FAIL, str(exc)), Check(f"cairn consumers {pool}", SKIP, "needs NATS")]
            continue
        checks += asyncio.run(nats_parts(settings, part.bridges, timeout_s))
    if cairn is not None and not pools_seen:
        checks += asyncio.run(nats_parts(cairn, None, timeout_s))
    return checks


def _nats_unchecked(pool: str, cairn: CairnSettings | None) -> str:
    """Why this environment cannot ask NATS about ``pool`` ("" when it can)."""
    if cairn is None:
        return (f"not checked: CAIRN_NATS_URL is not set here, and pool {pool} runs (its records say so); "
                "run the verdict with the fleet's environment")
    if pool != cairn.worker_name and not has_own_login(pool):
        return f"not checked: no NATS login of pool {pool} here ({pool_variable(pool, 'nats_user')} …)"
    return ""


def has_own_login(pool: str) -> bool:
    """Whether this environment holds ``pool``'s own NATS login (``CAIRN_POOL_<NAME>_*``). Another pool's
    JetStream API is outside a pool's template: asked with the configured pool's login it would be refused."""
    return any(os.environ.get(pool_variable(pool, field), "").strip() for field in POOL_CREDENTIALS)


@dataclass
class PoolView:
    """One Cairn pool as the records show it: its provider, provider workers and bridges."""

    provider: str
    workers: list[liveness.ProcessRecord]
    bridges: list[liveness.ProcessRecord]


def cairn_pools(cairn: CairnSettings | None, workers: list[liveness.ProcessRecord],
                bridges: list[liveness.ProcessRecord]) -> dict[str, PoolView]:
    """Every pool a worker or bridge record names (a Procfile may run several, each line naming its own),
    and the configured pool (``CAIRN_WORKER_NAME``) when ``CAIRN_NATS_URL`` is set."""
    providers = {r.pool: r.provider for r in [*workers, *bridges] if r.pool and r.provider}
    if cairn is not None:
        providers.setdefault(cairn.worker_name, cairn.provider)
    return {pool: PoolView(provider, [w for w in workers if PROVIDER_QUEUE_PREFIX + pool in w.queues],
                           [b for b in bridges if b.pool == pool])
            for pool, provider in sorted(providers.items())}


def _redis_parts(client: Any, app: Any, windows: HealthSettings, cairn: CairnSettings | None,
                 voicy_on: bool) -> tuple[list[Check], dict[str, PoolView]]:
    """Every part read from Redis (Redis answered), and the Cairn pools found there."""
    workers = liveness.read(client, liveness.WORKER)
    voicy_bridges = liveness.read(client, liveness.VOICY_BRIDGE)
    checks = [Check("redis", OK, "reachable"), beat_lock(client, app)]
    if voicy_on or voicy_bridges or any(q in w.queues for w in workers for q in QUEUES_VOICY):
        checks += [*pools(workers, QUEUES_VOICY), voicy_bridge(voicy_bridges)]
    found = cairn_pools(cairn, workers, liveness.read(client, liveness.CAIRN_BRIDGE))
    for pool, part in found.items():
        checks += [*pools(part.workers, (PROVIDER_QUEUE_PREFIX + pool,)),
                   presence(pool, part.workers, windows.presence_live_s, part.bridges),
                   manifest(pool, part.workers, windows.manifest_max_age_s)]
    checks.append(recorded_faults(client))
    return checks, found


def conclusion(checks: list[Check]) -> str:
    """The last line: ``HEALTHY`` only when every part was checked and none failed."""
    failing = [c.name for c in checks if c.failed]
    unchecked = [c.name for c in checks if c.status == SKIP]
    not_checked = f"not checked: {', '.join(unchecked)}" if unchecked else ""
    if failing:
        return f"{UNHEALTHY}{', '.join(failing)}" + (f"; {not_checked}" if not_checked else "")
    if unchecked:
        return f"{UNVERIFIED}{not_checked}"
    return f"HEALTHY: {len(checks)} parts checked"


def run(out: TextIO, timeout_s: float = DEFAULT_TIMEOUT_S, clear: bool = False) -> int:
    """Print one line per part and the verdict; 0 when healthy, 1 when a part failed or was not checked."""
    setup_logging("WARNING")
    checks = verdict(timeout_s, clear)
    for check in checks:
        print(check.line(), file=out, flush=True)
    last = conclusion(checks)
    print(last, file=out)
    return 0 if last.startswith(HEALTHY) else 1
