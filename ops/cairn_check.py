"""``switchyard check cairn``: the contract §10 conformance checks, on 0.7 pool subjects.

The published harness (reference §5) still checks the pre-0.5 four-token job
subjects and ``cairn.discover.<provider>``, which a 0.7 pool does not use; this
port keeps its rules and output format and moves them to the pool-scoped
subjects. It is stricter where the contract is explicit: the presence record
must carry every field of §2, and the ``--active`` reconcile round-trip must
come back with the full worker stamp and no error.

The checks run in the order of ``CHECKS``; each one records one or more
PASS/FAIL lines on the ``Report``. A new check (webhooks, say) is one more
``async def check_x(probe, report)`` appended there, with any option it needs
added to ``CheckOptions`` and to ``ops.commands.check``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

import nats
import nats.errors
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NoKeysError, NotFoundError
from nats.protocol.parser import PERMISSIONS_ERR

from ops.cairn_check_webhooks import check_webhooks
from workers.cairn.contract import subjects
from workers.cairn.handlers.discover import valid_discover_reply
from workers.logs import redact
from workers.providers.kinds import FETCH_SOURCE, IMPORT_GEAR, IMPORT_METRICS, PARSE_BLOB, RECONCILE

STREAM_JOBS = subjects.JOBS_STREAM
PRESENCE_BUCKET = subjects.PRESENCE_BUCKET
MANIFEST_BUCKET = subjects.MANIFEST_BUCKET
PRESENCE_MAX_AGE_S = 90.0  # the Go harness's freshness limit
PRESENCE_FIELDS = ("worker_name", "worker_key", "instance_id", "version", "release", "provider",
                   "package", "webhooks", "last_seen")  # capabilities: omitted when empty (reference §2.10)
METRIC_DATA_TYPES = frozenset({"Steps", "HRV", "RestingHR", "Sleep", "Weight", "WaterIntake"})
DOCS_URL = "https://docs.opencairn.org/architecture/provider-contract"
NAME_WIDTH = 40
DEFAULT_CHECK_TIMEOUT_S = 10.0
CONNECT_RETRY_WAIT_S = 0.1
CHECK_CONNECTION_NAME = "switchyard-check"  # the enrollment-token mode names the pool instead (core requires it)
AUTH_HINT = (" (NATS refused the credentials: set CAIRN_NATS_USER/CAIRN_NATS_PASSWORD, CAIRN_NATS_CREDS or "
             "CAIRN_WORKER_ENROLLMENT_TOKEN as on the pool, or pass --user/--password, --creds, --enrollment-token)")
# The §10 checks list consumers and presence keys and publish a job: core's access, which a pool's
# own login (core's worker template, contract §1) does not have.
REFUSED_HINT = ("NATS refused this login {count} subject(s) ({first}): the checks need core's NATS access, "
                "not the pool's; pass core's (or an admin's) login with --user/--password or --creds")
EXIT_OK, EXIT_VIOLATIONS, EXIT_CONNECT = 0, 1, 2


@dataclass
class CheckOptions:
    nats_url: str
    provider: str
    worker_name: str
    active: bool = False
    account_id: str = ""
    user_id: str = ""
    metrics: bool = False
    gear: bool = False
    parse_blob: bool = True
    timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
    webhooks: bool = False  # ops/cairn_check_webhooks.py
    verify_token: str | None = None
    # ``nats.connect`` options for the fleet's authentication (``workers.cairn.nats_conn.connect_options``:
    # user/password, creds file or enrollment token); empty for an anonymous dev NATS.
    connect: dict[str, Any] = field(default_factory=dict)


class CheckFailed(Exception):
    pass


@dataclass
class Report:
    out: TextIO
    failures: int = 0
    lines: list[str] = field(default_factory=list)

    def record(self, name: str, error: str | None) -> None:
        line = f"PASS  {name}" if error is None else f"FAIL  {name:<{NAME_WIDTH}} {error}"
        self.lines.append(line)
        print(line, file=self.out, flush=True)
        self.failures += error is not None


def subject_matches(filter_subject: str, subject: str) -> bool:
    """NATS token matching: ``*`` one token, ``>`` the rest (at least one token)."""
    if filter_subject == subject:
        return True
    f_tokens, s_tokens = filter_subject.split("."), subject.split(".")
    for i, token in enumerate(f_tokens):
        if token == ">":
            return len(s_tokens) > i
        if i >= len(s_tokens) or (token != "*" and token != s_tokens[i]):
            return False
    return len(f_tokens) == len(s_tokens)


def parse_rfc3339(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError("timestamp has no zone")
    return value


def job_subject(kind: str, o: CheckOptions) -> str:
    return subjects.job_subject(kind, o.provider, o.worker_name)


async def _presence(js: Any, o: CheckOptions) -> dict[str, Any]:
    # The pool's keys from the bucket's stream state, not ``kv.keys()``: that watcher can end its
    # initial values before a record rewritten while it starts (presence is rewritten every interval),
    # and the check would report a live pool absent.
    prefix = f"$KV.{PRESENCE_BUCKET}."
    try:
        kv = await js.key_value(PRESENCE_BUCKET)
        info = await js.stream_info(f"KV_{PRESENCE_BUCKET}", subjects_filter=f"{prefix}>")
    except (BucketNotFoundError, NotFoundError, NoKeysError) as exc:
        raise CheckFailed(f"no presence records ({type(exc).__name__})") from None
    keys = [subject[len(prefix):] for subject in (info.state.subjects or {})]
    mine, entry = [], None
    for key in (k for k in keys if k == o.worker_name or k.startswith(o.worker_name + ".")):
        try:  # a key whose last message is a delete marker (an instance that stopped) is not a record
            entry = entry or await kv.get(key)
            mine.append(key)
        except KeyNotFoundError:
            continue
    if not mine or entry is None:
        raise CheckFailed(f"no presence key for worker {o.worker_name!r}")
    try:
        record = json.loads(entry.value or b"")
        last_seen = parse_rfc3339(str(record["last_seen"]))
    except (ValueError, KeyError, TypeError):
        raise CheckFailed(f"{mine[0]}: not valid JSON with an RFC 3339 last_seen") from None
    age_s = (datetime.now(UTC) - last_seen).total_seconds()
    if age_s > PRESENCE_MAX_AGE_S:
        raise CheckFailed(f"{mine[0]}: stale (last_seen {age_s:.0f}s ago)")
    missing = [f for f in PRESENCE_FIELDS if f not in record]
    if missing:
        raise CheckFailed(f"{mine[0]}: missing fields {', '.join(missing)}")
    if record.get("provider") != o.provider:
        raise CheckFailed(f"{mine[0]}: provider {record.get('provider')!r}, expected {o.provider!r}")
    return record


async def _manifest(js: Any, o: CheckOptions) -> dict[str, Any] | None:
    """The pool's manifest, or None (no bucket, no key, undecodable): it only widens the checks."""
    try:
        entry = await (await js.key_value(MANIFEST_BUCKET)).get(o.worker_name)
        record = json.loads(entry.value or b"")
    except (TimeoutError, BucketNotFoundError, NotFoundError, KeyNotFoundError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def required_kinds(o: CheckOptions, presence: dict[str, Any] | None,
                   manifest: dict[str, Any] | None = None) -> list[str]:
    """fetch_source, reconcile (+ parse_blob), and import_metrics / import_gear when the pool
    declares a metric type / Gear: in its manifest (contract §3), else in its presence record."""
    kinds = [FETCH_SOURCE, RECONCILE]
    declared = (manifest or {}).get("capabilities") if manifest else None
    caps = declared if declared is not None else (presence or {}).get("capabilities") or {}
    if o.parse_blob:
        kinds.append(PARSE_BLOB)
    if o.metrics or METRIC_DATA_TYPES & set(caps):
        kinds.append(IMPORT_METRICS)
    if o.gear or "Gear" in caps:
        kinds.append(IMPORT_GEAR)
    return kinds


async def _consumer_filters(js: Any) -> list[list[str]]:
    filters = []
    for info in await js.consumers_info(STREAM_JOBS):
        cfg = info.config
        filters.append([s for s in ([cfg.filter_subject] + list(cfg.filter_subjects or [])) if s])
    return filters


def _check_consumer(filters: list[list[str]], subject: str) -> None:
    for consumer_filters in filters:
        if not consumer_filters or any(subject_matches(f, subject) for f in consumer_filters):
            return
    raise CheckFailed("no consumer on CAIRN_JOBS: jobs on it will accumulate unconsumed")


async def _discover(nc: Any, o: CheckOptions) -> None:
    subject = subjects.discover_subject(o.provider, o.worker_name)
    try:
        msg = await nc.request(subject, b'{"account_id":"","start_page":1}', timeout=o.timeout_s)
    except Exception as exc:  # noqa: BLE001 - any failure to answer is the violation
        raise CheckFailed(f"no reply on {subject} ({type(exc).__name__})") from None
    try:
        reply = json.loads(msg.data)
    except ValueError:
        raise CheckFailed("reply is not JSON") from None
    if not valid_discover_reply(reply):
        raise CheckFailed(f"reply has none of error/items/complete/next_page: {str(reply)[:120]}")


async def _reconcile_round_trip(nc: Any, js: Any, o: CheckOptions) -> None:
    if not o.account_id:
        raise CheckFailed("--active needs --account-id of a connected account")
    result_subject = subjects.reconcile_result_subject(o.provider, o.account_id)
    try:
        sub = await js.subscribe(result_subject, ordered_consumer=True, deliver_policy="new")
    except Exception as exc:  # noqa: BLE001 - no stream, no permission: the round trip cannot be watched
        raise CheckFailed(f"cannot watch {result_subject} ({type(exc).__name__})") from None
    try:
        job_id = f"conformance-{time.time_ns()}"
        body: dict[str, Any] = {"job_id": job_id, "account_id": o.account_id, "provider": o.provider,
                                "max_enqueue": 1}
        if o.user_id:
            body["user_id"] = o.user_id
        await js.publish(job_subject(RECONCILE, o), json.dumps(body).encode(),
                         headers={"Nats-Msg-Id": f"conformance:{job_id}"})
        try:
            msg = await sub.next_msg(timeout=o.timeout_s)
        except Exception:  # noqa: BLE001
            raise CheckFailed(f"no result on {result_subject} within {o.timeout_s:.0f}s "
                              "(does the pool coalesce reconcile jobs for this account?)") from None
    finally:
        await sub.unsubscribe()
    try:
        result = json.loads(msg.data)
    except ValueError:
        raise CheckFailed("result is not JSON") from None
    if not isinstance(result, dict) or not result.get("workerName"):
        raise CheckFailed("result has no workerName (protojson must use lowerCamel names)")
    if result.get("workerName") != o.worker_name:
        raise CheckFailed(f"result workerName {result.get('workerName')!r} is not the pool {o.worker_name!r}")
    missing = [k for k in ("workerVersion", "workerPackage") if not result.get(k)]
    if missing:
        raise CheckFailed(f"result lacks {', '.join(missing)}")
    if result.get("error"):
        raise CheckFailed(f"reconcile failed: {str(result['error'])[:160]}")


def _refused(exc: BaseException) -> bool:
    """An authentication refusal (nats-py raises its own class, or the server's -ERR text)."""
    return isinstance(exc, nats.errors.AuthorizationError) or "authorization" in str(exc).lower()


@dataclass
class Probe:
    """What every check reads: the connection, the options, and what earlier checks learned."""

    nc: Any
    js: Any
    options: CheckOptions
    presence: dict[str, Any] | None = None


Check = Callable[[Probe, Report], Awaitable[None]]


async def check_presence(probe: Probe, report: Report) -> None:
    try:
        probe.presence = await asyncio.wait_for(_presence(probe.js, probe.options), probe.options.timeout_s)
        report.record("presence heartbeat", None)
    except (TimeoutError, CheckFailed) as exc:
        report.record("presence heartbeat", str(exc) or "timed out")


async def check_consumers(probe: Probe, report: Report) -> None:
    try:
        filters = await _consumer_filters(probe.js)
    except Exception as exc:  # noqa: BLE001 - any failure to list is the violation
        report.record("consumers on CAIRN_JOBS", f"cannot list consumers: {type(exc).__name__}")
        return
    manifest = await _manifest(probe.js, probe.options)
    for kind in required_kinds(probe.options, probe.presence, manifest):
        subject = job_subject(kind, probe.options)
        try:
            _check_consumer(filters, subject)
            report.record(f"consumer for {subject}", None)
        except CheckFailed as exc:
            report.record(f"consumer for {subject}", str(exc))


async def check_discover(probe: Probe, report: Report) -> None:
    try:
        await _discover(probe.nc, probe.options)
        report.record("discover request/reply", None)
    except CheckFailed as exc:
        report.record("discover request/reply", str(exc))


async def check_reconcile(probe: Probe, report: Report) -> None:
    if not probe.options.active:
        return
    try:
        await _reconcile_round_trip(probe.nc, probe.js, probe.options)
        report.record("reconcile round-trip", None)
    except CheckFailed as exc:
        report.record("reconcile round-trip", str(exc))


# In order: the consumer checks read what the presence check learned.
CHECKS: tuple[Check, ...] = (check_presence, check_consumers, check_discover, check_webhooks, check_reconcile)


def public_url(url: str) -> str:
    """``url`` without its user-info: a ``nats://user:password@host`` URL is printed as ``nats://host``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])) if "@" in parts.netloc else url


async def run_checks(o: CheckOptions, out: TextIO) -> int:
    # The fleet's own authentication first (``o.connect``), then this run's bounds: nats-py retries an
    # unreachable server max_reconnect_attempts times even on the first connect, so the whole attempt
    # is bounded by the check timeout instead.
    refused: list[str] = []

    async def on_error(exc: Exception) -> None:
        """nats-py reports a permission refusal here, not to the call it broke (which then times out)."""
        if PERMISSIONS_ERR in str(exc).lower():
            refused.append(redact(str(exc)))

    options = {"servers": [o.nats_url], "name": CHECK_CONNECTION_NAME, **o.connect,
               "connect_timeout": o.timeout_s, "allow_reconnect": False, "max_reconnect_attempts": 1,
               "reconnect_time_wait": CONNECT_RETRY_WAIT_S, "error_cb": on_error}
    try:
        nc = await asyncio.wait_for(nats.connect(**options), o.timeout_s)
    except Exception as exc:  # noqa: BLE001
        reason = redact(f"{type(exc).__name__}: {exc}")
        print(f"cannot connect to {public_url(o.nats_url)}: {reason}{AUTH_HINT if _refused(exc) else ''}", file=out)
        return EXIT_CONNECT
    probe = Probe(nc, nc.jetstream(timeout=o.timeout_s), o)
    report = Report(out)
    try:
        for check in CHECKS:
            await check(probe, report)
    finally:
        await nc.close()
    if refused:  # not violations of the pool: this login could not look
        print(REFUSED_HINT.format(count=len(set(refused)), first=refused[0]), file=out)
        return EXIT_CONNECT
    if report.failures:
        print(f"{report.failures} violation(s) — see {DOCS_URL}", file=out)
        return EXIT_VIOLATIONS
    print("worker is contract-compliant", file=out)
    return EXIT_OK
