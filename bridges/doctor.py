"""``switchyard doctor``: check a deployment's configuration, one line per check, no side effects on work.

Each check says what it verified or what to fix. Checks of a side that is not
configured (no ``VOICY_WORKER_API_URL`` / no ``CAIRN_NATS_URL``) are skipped.
The presign probe uploads a few bytes through core's presigned URL (never our
own S3 credentials); core's bucket lifecycle reaps the unreferenced object.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import httpx

from workers.errors import AuthError, ConfigError, StaleJobError

PROBE_JOB_ID = "000000000000000000000000"  # a valid ObjectId no job has
HTTP_TIMEOUT_S = 10.0
NATS_TIMEOUT_S = 5.0


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    skipped: bool = False

    def line(self) -> str:
        mark = "skip" if self.skipped else ("ok  " if self.ok else "FAIL")
        return f"{mark} {self.name}: {self.detail}"


def _run(name: str, fn: Callable[[], str]) -> Check:
    try:
        return Check(name, True, fn())
    except Exception as exc:  # noqa: BLE001 - every failure becomes one readable line
        from workers.logs import redact

        return Check(name, False, redact(str(exc)) or type(exc).__name__)


def check_redis() -> str:
    import redis

    from tasks.settings import FleetSettings
    from workers.config import load_settings

    url = load_settings(FleetSettings).redis_url
    try:
        redis.Redis.from_url(url, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        raise RuntimeError(f"cannot reach REDIS_URL ({type(exc).__name__}); start Redis or fix REDIS_URL") from None
    return "reachable"


def voicy_checks() -> list[Check]:
    from workers.voicy.settings import load_voicy_settings

    try:
        settings = load_voicy_settings()
    except ConfigError as exc:
        return [Check("voicy settings", False, str(exc))]

    def token() -> str:
        from workers.voicy.client import VoicyClient

        client = VoicyClient.from_settings(settings)
        try:
            client.get_job(PROBE_JOB_ID)
        except StaleJobError:
            return "VOICY_WORKER_TOKEN accepted (probe job answers 404 job_not_found)"
        except AuthError:
            raise RuntimeError("VOICY_WORKER_TOKEN rejected (401): create a new token with "
                               "worker:create-client and set VOICY_WORKER_TOKEN") from None
        return "VOICY_WORKER_TOKEN accepted"

    def telegram() -> str:
        if settings.telegram_bot_token is None:
            raise RuntimeError("no bot token: set VOICY_WORKER_TELEGRAM_BOT_TOKEN (or TOKEN)")
        bot = settings.telegram_bot_token.get_secret_value()
        try:
            r = httpx.get(f"{settings.telegram_api_url}/bot{bot}/getMe", timeout=HTTP_TIMEOUT_S)
        except httpx.TransportError as exc:
            raise RuntimeError(f"VOICY_WORKER_TELEGRAM_API_URL unreachable ({type(exc).__name__})") from None
        if r.status_code != 200 or not r.json().get("ok"):
            raise RuntimeError(f"getMe answered HTTP {r.status_code}: check VOICY_WORKER_TELEGRAM_BOT_TOKEN")
        return f"getMe ok (@{r.json()['result'].get('username', '?')})"

    def model() -> str:
        from workers.transcribe.engine import create_engine

        try:
            engine = create_engine(settings)
        except Exception as exc:
            raise RuntimeError(f"VOICY_WORKER_MODEL={settings.model!s} does not load on "
                               f"{settings.device}: {type(exc).__name__}") from None
        info = engine.metadata
        return f"{info.model} loads on {info.device} ({info.compute_type}), engine {engine.name}"

    def store() -> str:
        from workers.voicy.media_store import media_store_from_url

        key = f"doctor-probe-{uuid.uuid4().hex}.bin"
        try:
            media = media_store_from_url(str(settings.media_store))
            media.put_stream(key, [b"probe"], max_bytes=16)
            media.delete(key)
        except Exception as exc:
            raise RuntimeError(f"VOICY_WORKER_MEDIA_STORE={settings.media_store} is not writable "
                               f"({type(exc).__name__})") from None
        return f"{settings.media_store} is writable"

    return [_run("voicy token", token), _run("telegram getMe", telegram), _run("model", model),
            _run("media store", store)]


def cairn_checks() -> list[Check]:
    from workers.cairn.settings import load_cairn_settings

    try:
        settings = load_cairn_settings()
    except ConfigError as exc:
        return [Check("cairn settings", False, str(exc))]
    return asyncio.run(_cairn_async(settings))


async def _cairn_async(settings) -> list[Check]:  # type: ignore[no-untyped-def]
    import nats

    from bridges.cairn_pool import IncompatibleCoreError, check_core_release
    from workers.cairn import subjects
    from workers.cairn.nats_conn import connect_options

    checks: list[Check] = []
    try:
        nc = await nats.connect(**{**connect_options(settings), "max_reconnect_attempts": 0,
                                   "connect_timeout": NATS_TIMEOUT_S})
    except Exception as exc:  # noqa: BLE001
        return [Check("nats", False, f"cannot connect to CAIRN_NATS_URL ({type(exc).__name__}); "
                                     "check the URL and CAIRN_WORKER_ENROLLMENT_TOKEN / CAIRN_NATS_*")]
    try:
        js = nc.jetstream()
        try:
            core = await check_core_release(js, settings.release)
            checks.append(Check("nats + core release", True,
                                f"connected; core {core or 'publishes no release (older core)'}"))
        except IncompatibleCoreError as exc:
            checks.append(Check("nats + core release", False, str(exc) + "; upgrade the pool or core"))

        async def request(subject: str, body: dict) -> dict:
            msg = await nc.request(subject, json.dumps(body).encode(), timeout=NATS_TIMEOUT_S)
            if msg.headers and msg.headers.get("Nats-Error"):
                raise RuntimeError(f"core refused {subject}: {msg.headers['Nats-Error'][:120]}")
            return json.loads(msg.data)

        try:
            reply = await request(subjects.token_subject(settings.provider, "get"),
                                  {"account_id": str(uuid.UUID(int=0))})
            checks.append(Check("provider credentials", True,
                                f"token responder answers ({reply.get('error') or 'ok'} for a probe account)"))
        except Exception as exc:  # noqa: BLE001
            checks.append(Check("provider credentials", False,
                                f"no answer on {subjects.token_subject(settings.provider, 'get')} "
                                f"({type(exc).__name__}): is core running with this provider?"))
        try:
            body = b"{}"
            import hashlib

            reply = await request(subjects.presign_upload_subject(settings.provider),
                                  {"kind": "result", "content_type": "application/json",
                                   "content_length": len(body),
                                   "content_sha256": hashlib.sha256(body).hexdigest()})
            r = httpx.put(reply["url"], content=body, headers=reply.get("required_headers") or {},
                          timeout=HTTP_TIMEOUT_S)
            if r.status_code >= 300:
                raise RuntimeError(f"PUT answered HTTP {r.status_code}")
            checks.append(Check("presign round trip", True, "presigned PUT through core works"))
        except Exception as exc:  # noqa: BLE001
            from workers.logs import redact

            checks.append(Check("presign round trip", False, redact(f"{type(exc).__name__}: {exc}")[:200]))
    finally:
        await nc.close()
    return checks


def run(out: TextIO) -> int:
    from workers.logs import setup_logging

    setup_logging("WARNING")
    checks = [_run("redis", check_redis)]
    if os.environ.get("VOICY_WORKER_API_URL") or os.environ.get("VOICY_WORKER_TOKEN"):
        checks += voicy_checks()
    else:
        checks.append(Check("voicy", True, "not configured (no VOICY_WORKER_API_URL)", skipped=True))
    if os.environ.get("CAIRN_NATS_URL"):
        checks += cairn_checks()
    else:
        checks.append(Check("cairn", True, "not configured (no CAIRN_NATS_URL)", skipped=True))
    for check in checks:
        print(check.line(), file=out)
    failed = [c for c in checks if not c.ok]
    print(f"{len(checks) - len(failed)} passed, {len(failed)} failed", file=out)
    return 1 if failed else 0
