"""The fleet on a TLS Redis (``rediss://``) whose certificate no system CA signed, as Heroku Redis's.

Redis itself is the real one; a TLS front (``devstack/infra/tls_front.py``) is the
only address the clients are given, so a client that spoke plain TCP, or dialled
another Redis, would fail, and its errors would fail the log budget. Heroku's
documented setting checks no certificate (``REDIS_SSL_CERT_REQS=none``, the
default); an operator who has the CA names it (``REDIS_SSL_CA_CERTS``) and sets
``required``. Every kind of client is tried in both: redis-py's blocking and
asyncio clients (leases, fleet records, RedBeat, the bridges) and Celery's broker
and result backend (kombu, Celery's Redis backend); the whole Procfile fleet runs
on Heroku's setting, with a Redis password in its URL that no log shows (S1).
"""

from __future__ import annotations

import asyncio
import logging
import random
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
import redis
from celery import Celery
from celery.app.utils import filter_hidden_settings
from kombu import Connection

from bench import chaos_count
from bench.chaos_rig import ChaosRig
from devstack.infra import services
from devstack.infra.log_budget import Allow
from devstack.infra.services import free_port
from devstack.infra.tls_front import TlsFront
from ops import health
from ops.doctor import check_redis
from tasks import hardening
from tasks.hardening import masked_url
from tasks.settings import celery_config
from tests.kit.waiting import wait_until
from workers import liveness
from workers.config import load_settings
from workers.errors import ConfigError
from workers.redisconn import RedisSettings, async_client, sync_client, tls_failure

LOG_BUDGET_ALLOW = [
    Allow(r"Setting ssl_cert_reqs=CERT_NONE when connecting to redis",
          reason="REDIS_SSL_CERT_REQS=none, Heroku Redis's documented setting: each Celery process says once "
                 "that the server's certificate is not checked (docs/operations.md 2.3)",
          provoked_by="test_the_procfile_fleet_runs_on_heroku_redis"),
]
DYNOS = {"web": 1, "voicy_bridge": 1, "cairn_bridge": 1, "gpu": 1, "io": 1, "provider": 1, "beat": 1}
VOICES, FETCHES = 1, 1  # a job per side: what is under test is the way to Redis, not the load
JOBS_BOUND_S = 240.0
PRESENCE_BOUND_S = 60.0
FLOWER_BOUND_S = 60.0
HEALTH_BOUND_S = 120.0
REDIS_PASSWORD = "sy-heroku-redis-SECRET-5d2e"  # S1: in REDIS_URL, and in no log, verdict or metric
CONNECT_BOUND_S = 10.0  # a loopback handshake; only a broken client takes longer


@pytest.fixture()
def front(redis_service: services.Service, tmp_path: Path) -> Iterator[TlsFront]:
    made = TlsFront(redis_service.port, tmp_path / "tls").start()
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture()
def tls_env(monkeypatch: pytest.MonkeyPatch, front: TlsFront) -> pytest.MonkeyPatch:
    """``REDIS_URL`` is the front's; the certificate is checked against the front's own CA."""
    monkeypatch.setenv("REDIS_URL", front.url())
    monkeypatch.setenv("REDIS_SSL_CERT_REQS", "required")
    monkeypatch.setenv("REDIS_SSL_CA_CERTS", str(front.certs.ca_bundle))
    monkeypatch.delenv("REDIS_SENTINEL_MASTER", raising=False)
    return monkeypatch


def celery_app() -> Celery:
    """An app configured as ``tasks.app`` is (``celery_config``, our transport and backend classes)."""
    app = Celery("tls-check")
    app.conf.update(celery_config())
    hardening.install(app)
    return app


def client_pings() -> dict[str, bool]:
    """Each kind of fleet client, built from the environment, asked to PING through the front."""
    client = sync_client()
    try:
        pinged = {"blocking": bool(client.ping())}
    finally:
        client.close()

    async def ping_async() -> bool:
        aclient = async_client()
        try:
            return bool(await aclient.ping())
        finally:
            await aclient.aclose()

    pinged["asyncio"] = asyncio.run(ping_async())
    app = celery_app()
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=CONNECT_BOUND_S)
        pinged["broker"] = conn.connected
    pinged["result backend"] = bool(app.backend.client.ping())
    app.backend.client.close()
    return pinged


@pytest.mark.parametrize("cert_reqs", ["required", "none"])
def test_every_kind_of_client_speaks_tls_and_checks_what_it_is_told(tls_env: pytest.MonkeyPatch, front: TlsFront,
                                                                    cert_reqs: str) -> None:
    if cert_reqs == "none":
        tls_env.delenv("REDIS_SSL_CA_CERTS")
    tls_env.setenv("REDIS_SSL_CERT_REQS", cert_reqs)
    assert client_pings() == dict.fromkeys(("blocking", "asyncio", "broker", "result backend"), True)
    assert front.sessions >= 4  # each came in through TLS: the plain port was never named to them


def test_a_certificate_no_trusted_ca_signed_is_refused_and_the_operators_tools_say_why(
        tls_env: pytest.MonkeyPatch, front: TlsFront) -> None:
    tls_env.delenv("REDIS_SSL_CA_CERTS")  # required, against the system's CAs: ours is not among them
    client = sync_client()
    try:
        with pytest.raises(redis.ConnectionError, match="certificate verify failed") as refused:
            client.ping()
    finally:
        client.close()
    assert "REDIS_SSL_CA_CERTS" in (tls_failure(refused.value) or "")
    # the doctor and the health verdict name the certificate, not an unreachable Redis
    with pytest.raises(RuntimeError) as said:
        check_redis()
    assert str(said.value) == (f"REDIS_URL {front.url()}: its TLS certificate was refused (unable to get local "
                               "issuer certificate): name the CA that signed it in REDIS_SSL_CA_CERTS, or set "
                               "REDIS_SSL_CERT_REQS=none as Heroku Redis documents")
    [redis_part] = [check for check in health.verdict(timeout_s=CONNECT_BOUND_S) if check.name == "redis"]
    assert redis_part.failed and redis_part.detail.startswith(
        f"REDIS_URL {front.url()}: its TLS certificate was refused"), redis_part


def test_a_plain_redis_behind_a_rediss_url_is_named_a_failed_handshake(tls_env: pytest.MonkeyPatch,
                                                                        redis_service: services.Service) -> None:
    tls_env.setenv("REDIS_URL", redis_service.url.replace("redis://", "rediss://"))
    tls_env.setenv("REDIS_SSL_CERT_REQS", "none")
    tls_env.delenv("REDIS_SSL_CA_CERTS")
    with pytest.raises(RuntimeError, match="the TLS handshake failed .*: a rediss:// REDIS_URL needs a server that "
                                           "speaks TLS on that port"):
        check_redis()


def test_a_ca_bundle_that_would_not_be_read_or_is_missing_stops_the_start(tls_env: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    tls_env.setenv("REDIS_SSL_CERT_REQS", "none")
    with pytest.raises(ConfigError, match="REDIS_SSL_CA_CERTS is set, but REDIS_SSL_CERT_REQS=none"):
        load_settings(RedisSettings)
    tls_env.setenv("REDIS_SSL_CERT_REQS", "required")
    tls_env.setenv("REDIS_SSL_CA_CERTS", str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="REDIS_SSL_CA_CERTS"):
        load_settings(RedisSettings)


def test_the_masked_broker_url_in_a_conf_reply_logs_no_tls_warning_a_bare_connection_still_does(
        front: TlsFront, caplog: pytest.LogCaptureFixture) -> None:
    """What a worker answers Flower's ``inspect conf`` with: the URL masked, and no warning about a
    connection that is never made; kombu's warning for a real connection without TLS options stays."""
    masked_url.install()
    with caplog.at_level(logging.WARNING, logger=masked_url.KOMBU_CONNECTION_LOGGER):
        shown = filter_hidden_settings({"broker_url": front.url().replace("rediss://", "rediss://:pw@")})
        assert shown["broker_url"].startswith("rediss://:********@") and not caplog.records
        Connection(front.url())
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith(masked_url.NO_TLS_OPTIONS_PREFIX)]


class HerokuRedisRig(ChaosRig):
    """The chaos rig's stack and the Procfile fleet, the fleet given only a TLS front to a Redis that
    asks for a password, as a Heroku Redis URL (``rediss://:<password>@host:port``) does."""

    front: TlsFront | None = None

    def _start_redis(self) -> services.Service:
        plain = super()._start_redis()
        client = redis.Redis.from_url(plain.url)
        client.config_set("requirepass", REDIS_PASSWORD)
        client.close()
        plain.url = plain.url.replace("redis://", f"redis://:{REDIS_PASSWORD}@")  # the rig's own reads, past the front
        self.front = TlsFront(plain.port, self.workdir / "tls").start()
        return plain

    def _fleet_env(self, token: str) -> dict[str, str]:
        env = super()._fleet_env(token)
        assert self.front is not None
        env.update({"REDIS_URL": self.front.url(password=REDIS_PASSWORD), "REDIS_SSL_CERT_REQS": "none",
                    "PORT": str(free_port()), "FLOWER_USER": "ops", "FLOWER_PASSWORD": "sy-flower-tls"})
        return env

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self.front is not None:
                self.front.stop()


@pytest.fixture()
def rig(tmp_path: Path) -> Iterator[HerokuRedisRig]:
    made = HerokuRedisRig(tmp_path, 15, 0, 0)
    try:
        made.start_services()
        made.start_fleet(dynos=DYNOS)
        yield made
    finally:
        made.stop()


def dyno_logs(rig: HerokuRedisRig) -> str:
    assert rig.supervisor is not None
    return rig.supervisor.log_tails()


def flower_metrics(rig: HerokuRedisRig) -> str | None:
    try:
        return httpx.get(f"http://127.0.0.1:{rig.env['PORT']}/metrics", timeout=5.0).text
    except httpx.HTTPError:
        return None


def presence_noted(rig: HerokuRedisRig) -> bool:
    """The pool's provider worker noted a presence write in its liveness record (read past the front)."""
    client = redis.Redis.from_url(rig.redis.url)
    try:
        return any(w.pool == rig.pool and w.presence_at is not None for w in liveness.read(client, liveness.WORKER))
    finally:
        client.close()


@pytest.mark.slow
def test_the_procfile_fleet_runs_on_heroku_redis(log_budget: list, rig: HerokuRedisRig) -> None:
    """Both sides' jobs end once, beat keeps the pool's presence, Flower reads every queue, and
    ``switchyard health`` says HEALTHY, all through TLS with Heroku's setting."""
    assert rig.supervisor is not None and rig.front is not None
    voices = rig._make_voicy(VOICES, random.Random(15), "tls")
    rig.voicy = voices
    fetches = rig._make_cairn(FETCHES, "tls")
    for job in fetches:
        rig._publish(job)
    rig.cairn = list(fetches)

    def done() -> bool:
        voicy_done = all(rig.voicy_api.get_job(j.job_id)["status"] in chaos_count.FINAL_VOICY for j in voices)
        return voicy_done and all(rig.cairn_results(j.job_id) for j in fetches)

    wait_until(done, JOBS_BOUND_S, f"both sides' jobs done\n{dyno_logs(rig)}")
    voicy, cairn = chaos_count.count_voicy(rig), chaos_count.count_cairn(rig)
    assert (voicy.completed, voicy.duplicates, voicy.lost) == (VOICES, [], []), voicy.as_dict()
    assert (cairn.completed, cairn.duplicates, cairn.lost) == (FETCHES, [], []), cairn.as_dict()

    # beat (RedBeat's lock and schedule over TLS) drives the pool's presence
    wait_until(lambda: len(rig.core.live_presence(rig.pool)) == 1, PRESENCE_BOUND_S, "a live presence record")
    # Flower's queue metrics read the broker through TLS too
    metrics = wait_until(partial(flower_metrics, rig), FLOWER_BOUND_S, "Flower's /metrics")
    assert "switchyard_broker_up 1.0" in metrics, metrics
    for queue in ("gpu", "io", f"provider.{rig.pool}"):
        assert f'switchyard_queue_messages{{queue="{queue}"}}' in metrics, (queue, metrics)

    assert not rig.supervisor.down() and not rig.supervisor.crash_exits(), dyno_logs(rig)
    # the fleet's verdict, once the provider worker's record (renewed every 5 s) notes its presence write
    wait_until(partial(presence_noted, rig), PRESENCE_BOUND_S, "the provider worker's record of its presence")
    verdict = subprocess.run([sys.executable, "-m", "ops", "health"], env=rig.env, capture_output=True, text=True,
                             timeout=HEALTH_BOUND_S, check=False)
    assert verdict.returncode == 0 and "HEALTHY" in verdict.stdout, verdict.stdout + verdict.stderr
    assert rig.front.sessions >= len(DYNOS)  # every process came in through TLS
    # S1: Redis's password, in every process's REDIS_URL, is in none of their logs
    assert REDIS_PASSWORD not in verdict.stdout + verdict.stderr + metrics
    rig.supervisor.stop()  # the logs whole, stops included
    leaks = [d.name for d in rig.supervisor.dynos if REDIS_PASSWORD in d.log_path.read_text(errors="replace")]
    assert not leaks, leaks
