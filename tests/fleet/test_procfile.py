"""The Procfile and app.json are the product's front door: every process type must start.

Each Procfile command is run for real, the way honcho and Heroku run it
(``bash -c <command>`` in its own process group, ``$PORT`` and friends
from the environment), against a real redis-server (and nats-server for the
Cairn bridge), and must reach its ready state: Flower serves ``/healthcheck``
and ``/metrics`` and guards its API; each Celery pool answers a ping and
consumes its queue with the declared pool; beat takes the RedBeat lock and a
second beat waits for it; each bridge names a missing variable and exits
non-zero, and starts with a valid configuration.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis

from devstack.infra.log_budget import Allow
from devstack.infra.services import Service, free_port, nats_login
from tests.kit.cairn_stack import CairnStack
from tests.kit.procfile import READY_TIMEOUT_S, ROOT, VENV_BIN, ProcfileProcess, fleet_env, procfile_entries
from tests.kit.queues import publish
from workers import liveness

# H1: each test's processes end with an empty log budget (tests/conftest.py ``log_budget``).
pytestmark = pytest.mark.usefixtures("log_budget")

APP_JSON = ROOT / "app.json"
OPERATIONS_MD = ROOT / "docs" / "operations.md"

HTTP_TIMEOUT_S = 5.0
QUEUED = 2  # messages the web test leaves in a pool's queue for /metrics to count
PING_TIMEOUT_S = 0.5
EXIT_CONFIG_ERROR = 2
EXPECTED_TYPES = {"web", "voicy_bridge", "cairn_bridge", "gpu", "io", "provider", "garmin_bridge", "garmin", "beat"}
WORKER_TYPES = ("gpu", "io", "provider", "garmin")
# The queue each worker line consumes (the Strava pool's name is CAIRN_WORKER_NAME, default strava-fetcher).
WORKER_QUEUES = {"gpu": "gpu", "io": "io", "provider": "provider.strava-fetcher", "garmin": "provider.garmin-fetcher"}
# Each worker line's Celery pool: the Garmin pool runs its I/O-bound jobs on threads, so one process (one
# in-memory Garmin session per account) serves a host and a burst logs in once per host (P1).
WORKER_POOLS = {"gpu": "prefork", "io": "prefork", "provider": "prefork", "garmin": "threads"}
POOL_IMPLEMENTATIONS = {"prefork": "prefork", "threads": "thread"}  # what ``inspect stats`` names each
POOL_LINES = {"provider": "cairn_bridge", "garmin": "garmin_bridge"}  # each pool: its workers' line, its bridge's
ADDON_VARS = {"REDIS_URL"}  # set by the heroku-redis add-on; app.json must not declare it
# Variables the platform (Heroku, honcho) sets, not the operator.
PLATFORM_VARS = {"PORT", "DYNO", "HONCHO_PROCESS_NAME"}
# The start-up tests point the Voicy bridge at a port where nothing listens (they check its start, not
# its work); on a loaded box its first claim can go out before the stop arrives.
LOG_BUDGET_ALLOW = [
    Allow(r"Voicy API unavailable \(Voicy API unavailable: POST /jobs/claim-download: ConnectError\)",
          logs=("voicy_bridge",), reason="no Voicy API behind the test's URL: a claim before the stop is refused",
          provoked_by="test_voicy_bridge_starts_with_a_valid_config "
                      "test_voicy_bridge_on_heroku_starts_with_an_s3_media_store"),
]
_ENV_REF = re.compile(r"\$\{?([A-Z_][A-Z0-9_]*)")


# ---------------------------------------------------------------------------- static checks
def test_honcho_check_accepts_the_procfile() -> None:
    run = subprocess.run([str(VENV_BIN / "honcho"), "check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    listed = re.search(r"Valid procfile detected \(([^)]*)\)", run.stdout + run.stderr)
    assert listed, run.stdout + run.stderr
    assert {name.strip() for name in listed[1].split(",")} == EXPECTED_TYPES


def test_worker_lines_declare_queue_pool_events_node_name_and_cold_shutdown() -> None:
    entries = procfile_entries()
    assert set(entries) == EXPECTED_TYPES
    for ptype in WORKER_TYPES:
        cmd = entries[ptype]
        assert "REMAP_SIGTERM=SIGQUIT celery -A tasks worker " in cmd, cmd
        queue = " -Q provider." if ptype in POOL_LINES else f" -Q {ptype} "
        assert queue in cmd and f" -P {WORKER_POOLS[ptype]} " in cmd and " -E " in cmd, cmd
        assert re.search(r" -n \S*@%h", cmd), cmd
    # A pool's worker and bridge lines name the same pool: the garmin lines set theirs, the Strava ones
    # read CAIRN_WORKER_NAME (app-wide, default strava-fetcher) for the bridge and the queue alike.
    assert "CAIRN_PROVIDER=garmin CAIRN_WORKER_NAME=garmin-fetcher " in entries["garmin"]
    assert entries["garmin_bridge"].startswith("CAIRN_PROVIDER=garmin CAIRN_WORKER_NAME=garmin-fetcher ")
    assert " -Q provider.garmin-fetcher " in entries["garmin"]
    assert " -Q provider.${CAIRN_WORKER_NAME:-strava-fetcher} " in entries["provider"]
    assert " -c 1 " in entries["gpu"]  # one model per GPU; the parent stays free for inspect
    assert "-S tasks.hardening.scheduler.ResilientRedBeatScheduler" in entries["beat"]  # RedBeat, riding out outages
    assert "REMAP_SIGTERM" not in entries["beat"]
    assert "--port=${PORT" in entries["web"] and "--conf=deploy/flowerconfig.py" in entries["web"]


def test_app_json_matches_the_procfile() -> None:
    app = json.loads(APP_JSON.read_text())
    assert app["name"] and app["description"]
    formation = app["formation"]
    assert set(formation) == EXPECTED_TYPES
    assert formation["beat"]["quantity"] == 1 and formation["web"]["quantity"] == 1
    env = app["env"]
    for name, spec in env.items():
        assert isinstance(spec, dict) and spec.get("description"), f"{name} has no description"
    assert env["FLOWER_PASSWORD"].get("generator") == "secret"
    assert any(addon["plan"].startswith("heroku-redis") for addon in
               ({"plan": a} if isinstance(a, str) else a for a in app["addons"]))
    assert not ADDON_VARS & set(env)
    referenced = {m for cmd in procfile_entries().values() for m in _ENV_REF.findall(cmd)}
    for name in referenced - PLATFORM_VARS - {"REMAP_SIGTERM"}:
        assert name in env, f"the Procfile reads {name} but app.json does not declare it"


def _env_var(cls: type, field: str) -> str:
    """The variable pydantic-settings actually reads first for ``field`` (aliases bypass the prefix)."""
    from pydantic import AliasChoices

    alias = cls.model_fields[field].validation_alias  # type: ignore[attr-defined]
    if isinstance(alias, str):
        return alias.upper()
    if isinstance(alias, AliasChoices) and isinstance(alias.choices[0], str):
        return alias.choices[0].upper()
    return f"{cls.model_config.get('env_prefix', '')}{field}".upper()  # type: ignore[attr-defined]


def _settings_env_names() -> set[str]:
    names: set[str] = set()
    for module, cls_name in (("tasks.settings", "FleetSettings"), ("workers.voicy.settings", "VoicySettings"),
                             ("workers.cairn.settings", "CairnSettings"),
                             ("workers.providers.strava.settings", "StravaSettings"),
                             ("workers.providers.strava.webhooks", "StravaWebhookSettings")):
        mod = pytest.importorskip(module)
        cls = getattr(mod, cls_name)
        names |= {_env_var(cls, field) for field in cls.model_fields}
    return names


def test_every_setting_is_documented_and_declared() -> None:
    names = _settings_env_names()
    env = json.loads(APP_JSON.read_text())["env"]
    docs = OPERATIONS_MD.read_text()
    missing_docs = sorted(n for n in names if f"`{n}`" not in docs)
    missing_app = sorted(n for n in names - ADDON_VARS if n not in env)
    assert not missing_docs, f"docs/operations.md does not document {missing_docs}"
    assert not missing_app, f"app.json does not declare {missing_app}"


# ---------------------------------------------------------------------------- web (Flower)
@pytest.mark.slow
def test_web_serves_flower_with_auth_metrics_and_healthcheck(
        redis_url: str, launch: Callable[..., ProcfileProcess]) -> None:
    port, password = free_port(), f"pw-{uuid.uuid4().hex}"
    web = launch("web", fleet_env(redis_url, PORT=str(port), FLOWER_PASSWORD=password,
                                  FLOWER_ADDRESS="127.0.0.1"))
    pool = f"sy-{uuid.uuid4().hex[:6]}"  # a pool of this test's own on the shared Redis: its queue is ours
    queue = f"provider.{pool}"
    client = redis.Redis.from_url(redis_url)
    record = liveness.ProcessRecord(role=liveness.CAIRN_BRIDGE, name=f"bridge-{pool}", pool=pool)
    liveness.renew(client, record)
    publish(redis_url, queue, QUEUED)
    web.wait_for_output(rf"Visit me at http://127\.0\.0\.1:{port}")
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, timeout=HTTP_TIMEOUT_S) as http:
        health = http.get("/healthcheck")
        assert health.status_code == 200 and health.text == "OK"
        metrics = http.get("/metrics")
        assert metrics.status_code == 200 and "flower_events_total" in metrics.text
        # the queue lengths Flower itself lacks (tasks.queue_metrics), from the fleet's Redis
        assert f'switchyard_queue_messages{{queue="{queue}"}} {QUEUED}.0' in metrics.text, metrics.text
        assert "switchyard_broker_up 1.0" in metrics.text
        assert http.get("/api/workers").status_code == 401
        assert http.get("/api/workers", auth=("admin", "wrong")).status_code == 401
        assert http.get("/", auth=("admin", "wrong")).status_code == 401
        assert http.get("/api/workers", auth=("admin", password)).status_code == 200
    assert password not in web.output()
    client.delete(queue, liveness.record_key(record.role, record.name))
    client.close()


@pytest.mark.slow
def test_web_refuses_to_start_without_authentication(
        redis_url: str, launch: Callable[..., ProcfileProcess]) -> None:
    web = launch("web", fleet_env(redis_url, PORT=str(free_port()), FLOWER_ADDRESS="127.0.0.1"))
    assert web.wait_exit() == EXIT_CONFIG_ERROR
    assert "FLOWER_PASSWORD" in web.output()


# ---------------------------------------------------------------------------- celery pools
@pytest.mark.slow
def test_each_pool_starts_consumes_its_queue_and_shuts_down_cold(
        fresh_redis: str, launch: Callable[..., ProcfileProcess]) -> None:
    from celery import Celery

    redis_url = fresh_redis  # the pools consume every queue: nothing an earlier test left in them may reach this one

    host, run = socket.gethostname(), uuid.uuid4().hex[:8]
    names = {ptype: f"{ptype}.{run}" for ptype in WORKER_TYPES}
    workers = {ptype: launch(ptype, fleet_env(redis_url, HONCHO_PROCESS_NAME=names[ptype],
                                              IO_CONCURRENCY="2", PROVIDER_CONCURRENCY="2", GARMIN_CONCURRENCY="2"))
               for ptype in WORKER_TYPES}
    nodes = {ptype: f"{names[ptype]}@{host}" for ptype in WORKER_TYPES}
    probe = Celery(broker=redis_url, backend=redis_url)
    try:
        pending = dict(nodes)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while pending and time.monotonic() < deadline:
            for ptype, proc in workers.items():
                assert proc.proc.poll() is None, f"{ptype} exited:\n{proc.output()[-4000:]}"
            replies = probe.control.ping(destination=list(pending.values()), timeout=PING_TIMEOUT_S)
            answered = {node for reply in replies for node in reply}
            pending = {p: n for p, n in pending.items() if n not in answered}
        assert not pending, f"no ping from {sorted(pending.values())}"
        inspect = probe.control.inspect(destination=list(nodes.values()), timeout=HTTP_TIMEOUT_S)
        stats, queues = inspect.stats() or {}, inspect.active_queues() or {}
        expected_concurrency = {"gpu": 1, "io": 2, "provider": 2, "garmin": 2}
        for ptype, node in nodes.items():
            assert stats[node]["pool"]["max-concurrency"] == expected_concurrency[ptype]
            assert POOL_IMPLEMENTATIONS[WORKER_POOLS[ptype]] in stats[node]["pool"]["implementation"]
            consumed = {q["name"] for q in queues[node]}
            assert consumed == {WORKER_QUEUES[ptype]}, (ptype, consumed)  # its own queue, nobody else's
    finally:
        probe.close()
    for ptype, proc in workers.items():  # REMAP_SIGTERM=SIGQUIT: SIGTERM to the group = cold shutdown
        proc.stop()
        assert "Cold shutdown" in proc.output(), f"{ptype}:\n{proc.output()[-2000:]}"


# ---------------------------------------------------------------------------- beat
@pytest.mark.slow
def test_beat_is_kept_single_by_the_redbeat_lock(redis_url: str,
                                                 launch: Callable[..., ProcfileProcess]) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    client.delete("redbeat::lock")
    first = launch("beat", fleet_env(redis_url))
    first.wait_for_output(r"beat: Acquired lock")
    assert client.exists("redbeat::lock")
    second = launch("beat", fleet_env(redis_url))
    second.wait_for_output(r"beat: Starting")
    assert "Acquired lock" not in second.output()
    first.stop()
    assert "Releasing lock" in first.output()
    second.wait_for_output(r"beat: Acquired lock")
    client.close()


# ---------------------------------------------------------------------------- bridges
@pytest.mark.slow
def test_voicy_bridge_names_a_missing_variable(redis_url: str,
                                               launch: Callable[..., ProcfileProcess]) -> None:
    """A side configured in part (a token, no URL) is a misconfiguration: exit 2 naming the variable."""
    bridge = launch("voicy_bridge", fleet_env(redis_url, VOICY_WORKER_TOKEN=f"vw_{uuid.uuid4().hex}"))
    assert bridge.wait_exit() == EXIT_CONFIG_ERROR
    assert "VOICY_WORKER_API_URL" in bridge.output()


@pytest.mark.slow
@pytest.mark.parametrize(("ptype", "side", "variables"), [
    ("voicy_bridge", "Voicy", "VOICY_WORKER_API_URL / VOICY_WORKER_TOKEN"),
    ("cairn_bridge", "Cairn", "CAIRN_NATS_URL"),
])
def test_a_bridge_whose_side_is_not_configured_exits_cleanly_with_one_line(
        redis_url: str, launch: Callable[..., ProcfileProcess], ptype: str, side: str, variables: str) -> None:
    """A one-click deploy configures one side: the other bridge says so once and exits 0, at once
    (no 30 s of dialling the default NATS, no exit 2 for the platform to restart into a loop)."""
    bridge = launch(ptype, fleet_env(redis_url, VOICY_WORKER_API_URL="", CAIRN_NATS_URL=""))
    assert bridge.wait_exit() == 0  # within EXIT_TIMEOUT_S, under the Cairn bridge's 30 s connect window
    lines = [line for line in bridge.output().splitlines() if line.strip()]
    name = ptype.replace("_", " ")
    assert lines == [f"switchyard {name}: the {side} side is not configured ({variables} unset); "
                     "nothing to bridge, exiting"], lines


@pytest.mark.slow
def test_voicy_bridge_starts_with_a_valid_config(redis_url: str, tmp_path: Path,
                                                 launch: Callable[..., ProcfileProcess]) -> None:
    token = f"vw_{uuid.uuid4().hex}"
    bridge = launch("voicy_bridge", fleet_env(
        redis_url, VOICY_WORKER_API_URL=f"http://127.0.0.1:{free_port()}/worker/v1",
        VOICY_WORKER_TOKEN=token, VOICY_WORKER_WORK_DIR=str(tmp_path / "work")))
    bridge.wait_for_output(r"voicy bridge started")
    assert bridge.stop() == 0
    assert "voicy bridge stopped" in bridge.output()
    assert token not in bridge.output()


@pytest.mark.slow
def test_voicy_bridge_on_heroku_starts_with_an_s3_media_store(redis_url: str, tmp_path: Path,
                                                             launch: Callable[..., ProcfileProcess]) -> None:
    """The other half of the Heroku rule (tests/fleet/test_start_config.py): an s3:// store passes it."""
    bridge = launch("voicy_bridge", fleet_env(
        redis_url, DYNO="voicy_bridge.1", VOICY_WORKER_MEDIA_STORE="s3://media/voicy",
        VOICY_WORKER_API_URL=f"http://127.0.0.1:{free_port()}/worker/v1", VOICY_WORKER_TOKEN=f"vw_{uuid.uuid4().hex}",
        VOICY_WORKER_WORK_DIR=str(tmp_path / "work")))
    bridge.wait_for_output(r"voicy bridge started")
    assert bridge.stop() == 0


@pytest.mark.slow
def test_cairn_bridge_names_an_invalid_variable(redis_url: str,
                                                launch: Callable[..., ProcfileProcess]) -> None:
    """Every CAIRN_* variable has a default, so the config error to prove is an invalid one."""
    bridge = launch("cairn_bridge", fleet_env(redis_url, CAIRN_NATS_URL="http://127.0.0.1:1"))
    assert bridge.wait_exit() == EXIT_CONFIG_ERROR
    assert "invalid configuration: CAIRN_NATS_URL" in bridge.output()


def _create_jobs_stream(nats_url: str) -> None:
    import asyncio

    import nats
    from nats.js.api import RetentionPolicy, StreamConfig
    from nats.js.errors import NotFoundError

    async def create() -> None:
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            try:
                await js.stream_info("CAIRN_JOBS")  # another test's dev core made it already
            except NotFoundError:
                await js.add_stream(StreamConfig(name="CAIRN_JOBS", subjects=["cairn.jobs.>"],
                                                 retention=RetentionPolicy.WORK_QUEUE))
        finally:
            await nc.close()

    asyncio.run(create())


@pytest.mark.slow
def test_cairn_bridge_starts_with_a_valid_config(redis_url: str, nats_service: Service, log_budget: list[Allow],
                                                 launch: Callable[..., ProcfileProcess]) -> None:
    """It starts, and a clean stop logs no warning (it used to log a false "NATS unavailable" for the
    disconnect its own drain causes)."""
    log_budget.append(Allow(r"core publishes no release \(no cairn_core/info\)", logs=("cairn_bridge",),
                            reason="a bare nats-server with CAIRN_JOBS and no core: nothing wrote cairn_core/info",
                            provoked_by="test_cairn_bridge_starts_with_a_valid_config"))
    _create_jobs_stream(nats_service.url)
    pool = f"strava-fetcher-{uuid.uuid4().hex[:6]}"
    login = nats_login(nats_service, "strava", pool)  # core's worker template for this pool
    bridge = launch("cairn_bridge", fleet_env(
        redis_url, CAIRN_NATS_URL=nats_service.url, CAIRN_PROVIDER="strava",
        CAIRN_WORKER_NAME=pool, CAIRN_RELEASE="dev", **login.env()))
    bridge.wait_for_output(r"cairn bridge started")
    assert bridge.stop() == 0
    assert "cairn bridge stopped" in bridge.output()


@pytest.mark.slow
def test_a_sigterm_stops_the_cairn_bridge_without_a_warning(tmp_path: Path, redis_url: str, s3_endpoint: str,
                                                          launch: Callable[..., ProcfileProcess]) -> None:
    """Issue 14: a clean stop logged ``NATS unavailable (disconnected; reconnecting)``: the bridge's
    own drain closing the connection was reported as an outage."""
    stack = CairnStack(tmp_path / "cairn", redis_url, s3_endpoint).start()
    try:
        bridge = launch("cairn_bridge", fleet_env(redis_url, **{k: v for k, v in stack.env.items()
                                                               if k.startswith("CAIRN_")}))
        bridge.wait_for_output(r"cairn bridge started")
        assert bridge.stop() == 0
    finally:
        stack.stop()
    output = bridge.output()
    assert "cairn bridge stopped" in output
    assert [line for line in output.splitlines() if "WARNING" in line or "Traceback" in line] == []
