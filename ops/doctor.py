"""``switchyard doctor``: check a deployment's configuration, one line per check, no side effects on work."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx
import nats
import redis
from huggingface_hub.errors import LocalEntryNotFoundError

from workers.cairn.compat import IncompatibleCoreError, check_core_release
from workers.cairn.contract import subjects
from workers.cairn.nats_conn import connect_options
from workers.cairn.settings import CairnSettings, load_cairn_settings
from workers.config import load_settings
from workers.errors import AuthError, ConfigError, RetryableJobError, StaleJobError
from workers.logs import redact, setup_logging
from workers.providers.registry import get_provider
from workers.redisconn import shown_url, sync_client, tls_failure
from workers.transcribe.engine import create_engine
from workers.voicy.client import VoicyClient
from workers.voicy.media_store import media_store_from_url
from workers.voicy.settings import VoicySettings, load_voicy_settings

PROBE_JOB_ID = "000000000000000000000000"  # a valid ObjectId no job has
# Every network call is bounded by one of these timeouts, so the doctor always ends.
HTTP_TIMEOUT_S = 10.0
REDIS_TIMEOUT_S = 3.0
NATS_TIMEOUT_S = 5.0  # bounds the whole connect (both attempts) and each request
# nats-py treats max_reconnect_attempts=0 as "unlimited" (it only gives up when the
# value is > 0), even on the first connect: one retry, then NoServersError.
NATS_CONNECT_RETRIES = 1
NATS_RETRY_WAIT_S = 0.1
DETAIL_MAX_CHARS = 200
HF_OFFLINE_ENV = "HF_HUB_OFFLINE"  # huggingface_hub's switch, which the engine honours as local_files_only

OK, FAIL, SKIP = "ok", "FAIL", "skip"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK, FAIL or SKIP
    detail: str

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def line(self) -> str:
        return f"{self.status:<4} {self.name}: {self.detail}"


def _run(name: str, fn: Callable[[], str]) -> Check:
    try:
        return Check(name, OK, fn())
    except Exception as exc:  # noqa: BLE001 - every failure becomes one readable line
        return Check(name, FAIL, redact(str(exc)) or type(exc).__name__)


def check_fleet_settings() -> str:
    """What every ``celery -A tasks`` process does first: import ``tasks``, which reads REDIS_URL
    and the beat periods and stops on a bad value."""
    # Imported here, not at the top: at the top, one bad value would crash the doctor
    # instead of becoming this check's FAIL line.
    import tasks  # noqa: F401
    from tasks.settings import FleetSettings

    load_settings(FleetSettings)  # read again: the variables may have changed since the import
    return "the Celery app loads (REDIS_URL and the beat periods are valid)"


def check_redis() -> str:
    from tasks.settings import FleetSettings  # see check_fleet_settings; it ran first

    url = load_settings(FleetSettings).redis_url
    client = sync_client(url)
    # Bounded on the pool's connection options, so the client stays the one redisconn builds.
    client.connection_pool.connection_kwargs.update(socket_connect_timeout=REDIS_TIMEOUT_S,
                                                    socket_timeout=REDIS_TIMEOUT_S)
    try:
        client.ping()
    except redis.RedisError as exc:
        if (tls := tls_failure(exc)) is not None:
            raise RuntimeError(f"REDIS_URL {shown_url(url)}: {tls}") from None
        raise RuntimeError(f"cannot reach REDIS_URL {shown_url(url)} ({type(exc).__name__}); start Redis or fix "
                           "REDIS_URL") from None
    finally:
        client.close()
    return "reachable"


# --- Voicy ------------------------------------------------------------------------------------
def voicy_checks() -> list[Check]:
    try:
        settings = load_voicy_settings()
    except ConfigError as exc:
        return [Check("voicy settings", FAIL, str(exc))]
    # Independent services: an unreachable Voicy API does not hide a bad bot token or model.
    return [_run("voicy token", lambda: _voicy_token(settings)), _run("telegram getMe", lambda: _telegram(settings)),
            _run("model", lambda: _model(settings)), _run("media store", lambda: _store(settings))]


def _voicy_token(settings: VoicySettings) -> str:
    client = VoicyClient(settings.api_url, settings.token.get_secret_value(), timeout_s=HTTP_TIMEOUT_S,
                         retry_attempts=1)
    try:
        client.get_job(PROBE_JOB_ID)
    except StaleJobError:
        return "VOICY_WORKER_TOKEN accepted (probe job answers 404 job_not_found)"
    except AuthError:
        raise RuntimeError("VOICY_WORKER_TOKEN rejected (401): create a new token with "
                           "worker:create-client and set VOICY_WORKER_TOKEN") from None
    except RetryableJobError as exc:  # connection error, timeout or 5xx
        reason = str(exc).rpartition(": ")[2]
        raise RuntimeError(f"cannot reach VOICY_WORKER_API_URL {settings.api_url} ({reason}); "
                           "start the Voicy backend or fix the URL") from None
    finally:
        client.close()
    return "VOICY_WORKER_TOKEN accepted"


def _telegram(settings: VoicySettings) -> str:
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


@contextlib.contextmanager
def _hub_offline() -> Iterator[None]:
    """The doctor never downloads: with ``HF_HUB_OFFLINE`` set the engine loads a model *name* with
    ``local_files_only`` (its own offline rule, ``workers.transcribe.whisper``), so a name this host
    lacks fails at once instead of starting a multi-GB download from the Hugging Face Hub."""
    before = os.environ.get(HF_OFFLINE_ENV)
    os.environ[HF_OFFLINE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(HF_OFFLINE_ENV, None)
        else:
            os.environ[HF_OFFLINE_ENV] = before


def _model_problem(model: str, exc: BaseException) -> str:
    """Why the model did not load, from the engine's underlying error (its ConfigError names only the class)."""
    cause = exc.__cause__ or exc.__context__ or exc
    if isinstance(cause, LocalEntryNotFoundError):
        return (f"{model} is not downloaded on this host (the doctor never downloads; a gpu worker would fetch "
                "it from the Hugging Face Hub at its first job): pre-download it and set VOICY_WORKER_MODEL "
                "to its CTranslate2 directory")
    if model.startswith(("/", ".", "~")) and not Path(model).expanduser().is_dir():
        return f"no directory {model} on this host"
    return redact(f"{type(cause).__name__}: {cause}")[:DETAIL_MAX_CHARS]


def _model(settings: VoicySettings) -> str:
    try:
        with _hub_offline():
            engine = create_engine(settings)
    except Exception as exc:  # noqa: BLE001 - any load failure is this check's answer
        raise RuntimeError(f"VOICY_WORKER_MODEL={settings.model!s} does not load on "
                           f"{settings.device}: {_model_problem(str(settings.model), exc)}") from None
    info = engine.metadata
    return f"{info.model} loads on {info.device} ({info.compute_type}), engine {engine.name}"


def _store(settings: VoicySettings) -> str:
    key = f"doctor-probe-{uuid.uuid4().hex}.bin"
    try:
        media = media_store_from_url(str(settings.media_store))
        media.put_stream(key, [b"probe"], max_bytes=16)
        media.delete(key)
    except Exception as exc:  # noqa: BLE001 - any store failure is this check's answer
        raise RuntimeError(f"VOICY_WORKER_MEDIA_STORE={settings.media_store} is not writable "
                           f"({type(exc).__name__})") from None
    return f"{settings.media_store} is writable"


# --- Cairn ------------------------------------------------------------------------------------
CAIRN_AFTER_NATS = ("provider credentials", "presign round trip")


def cairn_checks() -> list[Check]:
    """The pool this environment configures (``CAIRN_PROVIDER``, ``CAIRN_WORKER_NAME``): a fleet with
    several pools runs the doctor once per pool, with that pool's variables (docs/operations.md 2.5)."""
    try:
        settings = load_cairn_settings()
    except ConfigError as exc:
        return [Check("cairn settings", FAIL, str(exc))]
    return [_run("cairn pool", lambda: _pool(settings))] + asyncio.run(_cairn_async(settings))


def _pool(settings: CairnSettings) -> str:
    """The pool's provider builds from its own settings (``CAIRN_<PROVIDER>_*``), as the pool's bridge and
    workers build it at start: found by name through the registry, so no provider's variable is named here."""
    provider = get_provider(settings.provider, settings)  # ConfigError names the variable
    rules = provider.webhook_rules()
    webhooks = "on" if rules is not None and rules.enabled else "off"
    return (f"pool {settings.worker_name}: provider {settings.provider} (parser {provider.parser_version}), "
            f"package {settings.worker_package}, webhooks {webhooks}")


async def _quiet(exc: Exception) -> None:
    """nats-py's default error callback logs a traceback per failed attempt; the check line says enough."""


async def _connect(settings: CairnSettings) -> Any:
    options = {**connect_options(settings), "allow_reconnect": False,
               "max_reconnect_attempts": NATS_CONNECT_RETRIES, "reconnect_time_wait": NATS_RETRY_WAIT_S,
               "connect_timeout": NATS_TIMEOUT_S, "error_cb": _quiet}
    return await asyncio.wait_for(nats.connect(**options), NATS_TIMEOUT_S)


async def _cairn_async(settings: CairnSettings) -> list[Check]:
    try:
        nc = await _connect(settings)
    except Exception as exc:  # noqa: BLE001 - any connect failure is this check's answer
        reason = "timed out" if isinstance(exc, asyncio.TimeoutError) else type(exc).__name__
        return [Check("nats + core release", FAIL,
                      f"cannot connect to CAIRN_NATS_URL ({reason}); check the URL and "
                      "CAIRN_WORKER_ENROLLMENT_TOKEN / CAIRN_NATS_*")] + [
            Check(name, SKIP, "needs NATS") for name in CAIRN_AFTER_NATS]
    try:
        return [await _core_release(nc, settings), await _credentials(nc, settings),
                await _presign(nc, settings)]
    finally:
        await nc.close()


async def _request(nc: Any, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    msg = await nc.request(subject, json.dumps(body).encode(), timeout=NATS_TIMEOUT_S)
    if msg.headers and msg.headers.get("Nats-Error"):
        raise RuntimeError(f"core refused {subject}: {msg.headers['Nats-Error'][:120]}")
    return json.loads(msg.data)


async def _core_release(nc: Any, settings: CairnSettings) -> Check:
    try:
        core = await asyncio.wait_for(check_core_release(nc.jetstream(timeout=NATS_TIMEOUT_S), settings.release),
                                      NATS_TIMEOUT_S)
    except IncompatibleCoreError as exc:
        return Check("nats + core release", FAIL, str(exc) + "; upgrade the pool or core")
    except Exception as exc:  # noqa: BLE001 - JetStream missing or not answering
        return Check("nats + core release", FAIL, f"connected, but JetStream does not answer "
                                                  f"({type(exc).__name__}): is core's NATS JetStream-enabled?")
    return Check("nats + core release", OK, f"connected; core {core or 'publishes no release (older core)'}")


async def _credentials(nc: Any, settings: CairnSettings) -> Check:
    subject = subjects.token_subject(settings.provider, "get")
    try:
        reply = await _request(nc, subject, {"account_id": str(uuid.UUID(int=0))})
    except Exception as exc:  # noqa: BLE001 - no answer is this check's answer
        return Check("provider credentials", FAIL,
                     f"no answer on {subject} ({type(exc).__name__}): is core running with this provider?")
    return Check("provider credentials", OK,
                 f"token responder answers ({reply.get('error') or 'ok'} for a probe account)")


async def _presign(nc: Any, settings: CairnSettings) -> Check:
    """Upload a few bytes through core's presigned URL (never our own S3 credentials); core's bucket
    lifecycle reaps the unreferenced object."""
    body = b"{}"
    try:
        reply = await _request(nc, subjects.presign_upload_subject(settings.provider),
                               {"kind": "result", "content_type": "application/json",
                                "content_length": len(body), "content_sha256": hashlib.sha256(body).hexdigest()})
        r = httpx.put(reply["url"], content=body, headers=reply.get("required_headers") or {},
                      timeout=HTTP_TIMEOUT_S)
        if r.status_code >= 300:
            raise RuntimeError(f"PUT answered HTTP {r.status_code}")
    except Exception as exc:  # noqa: BLE001 - any failure of the round trip is this check's answer
        return Check("presign round trip", FAIL, redact(f"{type(exc).__name__}: {exc}")[:DETAIL_MAX_CHARS])
    return Check("presign round trip", OK, "presigned PUT through core works")


# --- the report -------------------------------------------------------------------------------
def summary(checks: list[Check]) -> str:
    counts = {status: sum(c.status == status for c in checks) for status in (OK, FAIL, SKIP)}
    return f"{counts[OK]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped"


def run(out: TextIO) -> int:
    """Run every check, print one line each and the summary; 1 when any check failed.

    A side that is not configured is skipped, and so are the checks that need a service found unreachable
    just before: an unreachable service is one FAIL line, never a cascade and never a traceback."""
    setup_logging("WARNING")
    fleet = _run("fleet settings", check_fleet_settings)
    checks = [fleet, _run("redis", check_redis) if not fleet.failed
              else Check("redis", SKIP, "needs valid fleet settings")]
    if os.environ.get("VOICY_WORKER_API_URL") or os.environ.get("VOICY_WORKER_TOKEN"):
        checks += voicy_checks()
    else:
        checks.append(Check("voicy", SKIP, "not configured (no VOICY_WORKER_API_URL)"))
    if os.environ.get("CAIRN_NATS_URL"):
        checks += cairn_checks()
    else:
        checks.append(Check("cairn", SKIP, "not configured (no CAIRN_NATS_URL)"))
    for check in checks:
        print(check.line(), file=out, flush=True)
    print(summary(checks), file=out)
    return 1 if any(c.failed for c in checks) else 0
