"""Production NATS permissions for the dev stack: a ``core`` user and core's worker template.

Contract §1: under auth-callout a worker MUST stay within core's standard
permission template, and anything else is refused with ``Permissions
Violation``. A dev nats-server without authorization refuses nothing, so a pool
that strays (the legacy unfiltered consumer create, a subject no section
defines) passed every test and failed in production. So every nats-server the
dev stack starts (``devstack.infra.services.start_nats``) runs with:

* a ``core`` user that may do everything (the dev Cairn core);
* one user per provider pool — ``worker`` for the first, ``worker-<worker_key>``
  for pools added later (:meth:`NatsAuth.grant`, a config reload) — whose
  publish and subscribe allow-lists are exactly :func:`worker_template`,
  derived line by line from contract §1–§9 and commented with its section;
* ``no_auth_user: core``: a connection without credentials (a test's own
  probe, the dev core when it is given none) acts as core. The fleet (bridges,
  provider workers, doctor) logs in through ``CAIRN_NATS_USER`` /
  ``CAIRN_NATS_PASSWORD`` (:meth:`NatsLogin.env`), so it runs as production does;
  the monitoring endpoint (``/connz?auth=1``) tells which user each connection is.

The server logs to ``nats.log`` in its directory; :meth:`NatsAuth.violations`
returns every refusal it logged (``Publish Violation``/``Subscription
Violation``), which the permission tests assert is empty.

Durable names are pinned to the pool's own (``workers.cairn.contract.subjects``):
``<worker_name>_<kind>`` and ``<worker_name>__webhook_event``. Core's template
allows filtered creation of the pool's job subjects whatever the name; pinning
the name is stricter, so a pool that passes here passes there.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from workers.cairn.contract import subjects

CORE_USER = "core"
WORKER_USER = "worker"
LOG_NAME = "nats.log"
CONFIG_NAME = "nats.conf"
RELOAD_TIMEOUT_S = 10.0
RELOAD_POLL_S = 0.02
RELOADED_LINE = "Reloaded server configuration"
VIOLATION_MARKERS = ("Permissions Violation", "Publish Violation", "Subscription Violation")
PASSWORD_BYTES = 18
CONNZ_LIMIT = 1024
MONITOR_TIMEOUT_S = 5.0

# (subject, why it is granted: the contract section)
Grant = tuple[str, str]


@dataclass(frozen=True)
class Pool:
    """One provider pool: the ``<provider>.<worker_name>`` every one of its subjects names."""

    provider: str
    worker_name: str

    @property
    def key(self) -> str:
        return subjects.worker_key(self.worker_name, self.provider)


@dataclass(frozen=True)
class NatsLogin:
    """One user's credentials (dev only: random per server)."""

    user: str
    password: str

    def env(self) -> dict[str, str]:
        """What a fleet process reads (``CairnSettings.nats_user`` / ``nats_password``)."""
        return {"CAIRN_NATS_USER": self.user, "CAIRN_NATS_PASSWORD": self.password}

    def connect_options(self) -> dict[str, str]:
        """``nats.connect`` keyword arguments."""
        return {"user": self.user, "password": self.password}


def _consumer_api(stream: str, durable: str, filter_subject: str, section: str) -> list[Grant]:
    """The JetStream API of one pull consumer the pool creates and pulls from."""
    return [
        (f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.{filter_subject}", f"{section}: filtered consumer creation"),
        (f"$JS.API.CONSUMER.INFO.{stream}.{durable}", f"{section}: its consumer's info"),
        (f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}", f"{section}: pull the next messages"),
        (f"$JS.ACK.{stream}.{durable}.>", f"{section}: ack / nak / term / in_progress"),
    ]


def _kv_open(bucket: str, section: str) -> list[Grant]:
    return [(f"$JS.API.STREAM.INFO.KV_{bucket}", f"{section}: open the {bucket} bucket")]


def _kv_read(bucket: str, keys: str, section: str) -> list[Grant]:
    """Direct get, scoped to the keys (core's buckets allow it, as nats.go creates KV buckets)."""
    return [*_kv_open(bucket, section),
            (f"$JS.API.DIRECT.GET.KV_{bucket}.$KV.{bucket}.{keys}", f"{section}: read {bucket} keys")]


def _kv_write(bucket: str, keys: str, section: str) -> list[Grant]:
    return [(f"$KV.{bucket}.{keys}", f"{section}: write {bucket} keys")]


def worker_template(pool: Pool) -> tuple[list[Grant], list[Grant]]:
    """(publish, subscribe) allow-lists of one pool: core's standard template, contract §1–§9."""
    p, w, key = pool.provider, pool.worker_name, pool.key
    publish: list[Grant] = []
    for kind in subjects.JOB_KINDS:  # §3 table: the pool's job subjects, each filtered exactly
        publish += _consumer_api(subjects.JOBS_STREAM, subjects.durable_name(w, kind),
                                 subjects.job_subject(kind, p, w), f"§3 {kind} jobs")
    publish += [(subjects.job_subject(subjects.FETCH_SOURCE, p, w), "§3/§7: fetch_source sub-jobs to its own pool")]
    publish += [(subjects.result_subject(kind, p, w), f"§5: {kind} results") for kind in subjects.JOB_KINDS
                if kind != subjects.RECONCILE]
    publish += [
        (subjects.reconcile_result_subject(p, "*"), "§7: reconcile results, account-suffixed"),
        (subjects.STREAM_NAMES_API, "§5: which stream captures a subject (publish routing)"),
        (subjects.presign_upload_subject(p), "§5: presign a PUT (claim-check, raw archive)"),
        (subjects.presign_download_subject(p), "§4: re-presign a parse_blob download"),
        *[(subjects.token_subject(p, op), f"§9: tokens {op}") for op in ("get", "store", "needs_reauth")],
        (subjects.creds_subject(p), "§9: credentials of a credentials provider"),
        (subjects.account_lookup_subject(p, w), "§9a: webhook owner → account lookup"),
    ]
    publish += _consumer_api(subjects.WEBHOOKS_STREAM, subjects.webhook_durable_name(w),
                             subjects.webhook_event_subject(key), "§9a webhook events")
    publish += _kv_open(subjects.PRESENCE_BUCKET, "§2 presence")  # written, never read
    publish += _kv_write(subjects.PRESENCE_BUCKET, f"{w}.*", "§2 presence: <worker_name>.<instance_id>")
    publish += _kv_open(subjects.MANIFEST_BUCKET, "§1 manifest")
    publish += _kv_write(subjects.MANIFEST_BUCKET, w, "§1 manifest: <worker_name>")
    publish += _kv_read(subjects.RATE_LIMIT_BUCKET, f"{p}.>", "§3/§9 rate limits")
    publish += _kv_write(subjects.RATE_LIMIT_BUCKET, f"{p}.>", "§3/§9 rate limits: <provider>.<app_id>.<window>")
    publish += _kv_read(subjects.CORE_BUCKET, subjects.CORE_INFO_KEY, "§1 Versioning: core's release (read only)")
    publish += [(subjects.worker_subject_prefix(key), "§1: the pool's own subjects"),
                ("_INBOX.>", "replies to core's requests (discover, exchange, verify)")]
    subscribe: list[Grant] = [
        ("_INBOX.>", "replies to our requests, PubAcks, pull-consumer deliveries"),
        (subjects.discover_subject(p, w), "§8: discover responder"),
        (subjects.oauth_exchange_subject(p, w), "§9b: OAuth code exchange responder"),
        (subjects.webhook_verify_subject(key), "§9a: webhook verify handshake (events come by the pull consumer)"),
        (subjects.worker_subject_prefix(key), "§1: the pool's own subjects"),
        (subjects.worker_cmd_subject(key, ">"), "§1: commands to the pool"),
    ]
    return publish, subscribe


def _allow_block(grants: list[Grant], indent: str) -> str:
    width = max(len(json.dumps(s)) for s, _ in grants) + 1
    lines = [f"{indent}{json.dumps(s) + ',':<{width + 1}} # {why}" for s, why in grants]
    return "\n".join(lines)


def render_config(*, port: int, http_port: int, store_dir: Path, log_file: Path, server_name: str,
                  core: NatsLogin, workers: dict[Pool, NatsLogin], withheld: frozenset[str] = frozenset(),
                  anonymous: bool = True, host: str = "127.0.0.1") -> str:
    """The nats-server configuration: JetStream, the monitoring port, ``core`` and one user per pool.

    ``withheld`` subjects are left out of every worker template: how a test stands in for a core
    whose template lacks a subject the pool uses. Without ``anonymous`` a client that does not log
    in is refused, as by a production core.
    """
    users = [f"    {{user: {json.dumps(core.user)}, password: {json.dumps(core.password)}}}  # core: everything"]
    for pool, login in workers.items():
        publish, subscribe = (
            [g for g in grants if g[0] not in withheld] for grants in worker_template(pool))
        users.append(
            f"    # pool {pool.provider}.{pool.worker_name}: core's standard worker template (contract §1)\n"
            f"    {{user: {json.dumps(login.user)}, password: {json.dumps(login.password)}, permissions: {{\n"
            f"      publish: {{allow: [\n{_allow_block(publish, '        ')}\n      ]}}\n"
            f"      subscribe: {{allow: [\n{_allow_block(subscribe, '        ')}\n      ]}}\n"
            f"    }}}}")
    return "\n".join([
        "# Rendered by devstack/infra/nats_auth.py: the dev stack under production permissions.",
        f"listen: {host}:{port}",
        f"http: {host}:{http_port}",
        f"server_name: {json.dumps(server_name)}",
        f"log_file: {json.dumps(str(log_file))}",
        f"jetstream: {{store_dir: {json.dumps(str(store_dir))}}}",
        (f"no_auth_user: {json.dumps(core.user)}  # dev convenience: an anonymous probe is core, never the fleet"
         if anonymous else "# no no_auth_user: every client logs in, as on a production core"),
        "authorization {",
        "  users = [",
        "\n".join(users),
        "  ]",
        "}",
        "",
    ])


def _password() -> str:
    return secrets.token_urlsafe(PASSWORD_BYTES)


@dataclass
class NatsAuth:
    """The users of one dev nats-server, its config file and its log; :meth:`grant` adds a pool."""

    workdir: Path
    port: int
    http_port: int
    server_name: str
    core: NatsLogin = field(default_factory=lambda: NatsLogin(CORE_USER, _password()))
    workers: dict[Pool, NatsLogin] = field(default_factory=dict)
    withheld: frozenset[str] = frozenset()  # left out of every worker template (tests of a refusal)
    anonymous: bool = True  # a client without credentials acts as core; False: it is refused
    host: str = "127.0.0.1"  # the address it listens on (a hosts rig's core host: services.listen_host())

    @property
    def config_path(self) -> Path:
        return self.workdir / CONFIG_NAME

    @property
    def log_path(self) -> Path:
        return self.workdir / LOG_NAME

    @property
    def monitor_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    def add(self, pool: Pool) -> NatsLogin:
        """Register ``pool`` (before the server starts, or followed by a reload)."""
        if pool not in self.workers:
            user = WORKER_USER if not self.workers else f"{WORKER_USER}-{pool.key}"
            self.workers[pool] = NatsLogin(user, _password())
        return self.workers[pool]

    def write(self) -> Path:
        self.config_path.write_text(render_config(
            port=self.port, http_port=self.http_port, store_dir=self.workdir / "js", log_file=self.log_path,
            server_name=self.server_name, core=self.core, workers=self.workers, withheld=self.withheld,
            anonymous=self.anonymous, host=self.host))
        return self.config_path

    def grant(self, pool: Pool, pid: int) -> NatsLogin:
        """The pool's login on the running server ``pid``: added and reloaded if it is new."""
        if pool in self.workers:
            return self.workers[pool]
        login = self.add(pool)
        reloads = self._reloads()
        self.write()
        signal_reload(pid)
        deadline = time.monotonic() + RELOAD_TIMEOUT_S
        while self._reloads() <= reloads:  # the server says so in its log: no other event to await
            if time.monotonic() > deadline:
                raise TimeoutError(f"nats-server did not reload {self.config_path} within {RELOAD_TIMEOUT_S}s")
            time.sleep(RELOAD_POLL_S)
        return login

    def login(self, pool: Pool) -> NatsLogin:
        return self.workers[pool]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _reloads(self) -> int:
        return self.log().count(RELOADED_LINE)

    def connections(self) -> list[dict[str, object]]:
        """Live client connections, each with the user it authenticated as (``/connz?auth=1``)."""
        reply = httpx.get(f"{self.monitor_url}/connz", params={"auth": "1", "limit": str(CONNZ_LIMIT)},
                          timeout=MONITOR_TIMEOUT_S)
        reply.raise_for_status()
        return list(reply.json().get("connections") or [])

    def violations(self) -> list[str]:
        """Every permission refusal the server logged."""
        return [line for line in self.log().splitlines() if any(m in line for m in VIOLATION_MARKERS)]


def signal_reload(pid: int) -> None:
    """nats-server reloads its configuration on SIGHUP."""
    os.kill(pid, signal.SIGHUP)
