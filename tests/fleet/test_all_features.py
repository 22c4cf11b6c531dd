"""The real deployment, every feature on at once (issue 14 §2, H1, C5).

The Procfile's own command lines under the supervisor (``devstack/infra/supervisor.py``),
with everything a production deployment switches on together:

* Redis through Sentinel (master, replica, three Sentinels: ``REDIS_URL=sentinel://...``);
* the S3 media store (moto in server mode): io and gpu share nothing else;
* clip batching across jobs, as a GPU host runs it (a CPU's default is off);
* ``LOG_FORMAT=json``;
* Flower with auth (the ``web`` line);
* Strava webhooks with a verify token, and the pool under core's NATS permission template;
* two gpu workers and two provider workers.

Both sides get real work: voice messages, ``fetch_source`` jobs, a webhook-pushed
activity and a ``parse_blob`` of an archived source. Every job must end once, every
process must still run (none exited by itself), both provider workers must keep a
live presence record that says they take webhooks, Flower must refuse a request
without its credentials and count each queue on ``/metrics``, ``switchyard health``
must say HEALTHY, and the log budget must find nothing beyond its baseline in any
process's log.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from bench import chaos_count
from bench.chaos_rig import PROVIDER, ChaosRig
from devstack import demo_webhook
from devstack.infra import services
from devstack.infra.sentinel import SentinelTopology, start_sentinel_topology
from devstack.infra.services import free_port
from tests.kit.waiting import wait_until
from workers.providers.strava.dataset import PARSER_VERSION  # the Strava pool's own parser version

pytestmark = pytest.mark.slow

DYNOS = {"web": 1, "voicy_bridge": 1, "cairn_bridge": 1, "gpu": 2, "io": 1, "provider": 2, "beat": 1}
MEDIA_BUCKET = "sy-features-media"
FLOWER_USER, FLOWER_PASSWORD = "ops", "sy-flower-SECRET-7c1e"
VOICES, FETCHES = 4, 3
CLIPS_PER_PASS = "4"
JOBS_BOUND_S = 240.0
PRESENCE_BOUND_S = 60.0
FLOWER_BOUND_S = 60.0
HEALTH_BOUND_S = 120.0


class AllFeaturesRig(ChaosRig):
    """The chaos rig's stack and Procfile fleet, with Sentinel, S3 media, JSON logs, Flower and webhooks."""

    sentinel: SentinelTopology | None = None

    def _start_redis(self) -> services.Service:
        self.sentinel = start_sentinel_topology(self.workdir / "sentinel")
        return self.sentinel.master

    def _fleet_env(self, token: str) -> dict[str, str]:
        env = super()._fleet_env(token)
        assert self.sentinel is not None
        env.update(self.sentinel.env())  # REDIS_URL=sentinel://...;..., REDIS_SENTINEL_MASTER
        env.update({
            "VOICY_WORKER_MEDIA_STORE": f"s3://{MEDIA_BUCKET}/voicy", "VOICY_WORKER_S3_ENDPOINT_URL": self.s3_endpoint,
            "AWS_ACCESS_KEY_ID": "features", "AWS_SECRET_ACCESS_KEY": "features", "AWS_DEFAULT_REGION": "us-east-1",
            "LOG_FORMAT": "json", "FLOWER_USER": FLOWER_USER, "FLOWER_PASSWORD": FLOWER_PASSWORD,
            "PORT": str(free_port()), "VOICY_WORKER_CLIP_BATCH_SIZE": CLIPS_PER_PASS,
        })
        env.update(demo_webhook.fleet_env())  # CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN
        return env

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self.sentinel is not None:
                self.sentinel.stop()


@pytest.fixture()
def rig(tmp_path: Path) -> Iterator[AllFeaturesRig]:
    made = AllFeaturesRig(tmp_path, 14, 0, 0)
    try:
        made.start_services()
        boto3.client("s3", endpoint_url=made.s3_endpoint, aws_access_key_id="features",
                     aws_secret_access_key="features", region_name="us-east-1").create_bucket(Bucket=MEDIA_BUCKET)
        made.start_fleet(dynos=DYNOS)
        yield made
    finally:
        made.stop()


def flower_answers(rig: AllFeaturesRig, auth: tuple[str, str] | None) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{rig.env['PORT']}/", auth=auth, timeout=5.0).status_code
    except httpx.HTTPError:
        return None


def parse_blob_job(rig: AllFeaturesRig, fetch: dict[str, Any]) -> dict[str, Any]:
    """A ``parse_blob`` of the raw source a finished ``fetch_source`` archived."""
    [imported] = [r for r in rig.core.ingested if r.msg_id == f"result:{fetch['job_id']}:d1"]
    raw_key = imported.data["events"][-1]["activity"]["rawBlobId"]
    return dict(fetch, job_id=f"reparse-{uuid.uuid4().hex[:8]}", min_parser_version=PARSER_VERSION,
                blob={"url": rig.core.blobs.presign_download(raw_key)["url"], "expires_at": "2099-01-01T00:00:00Z",
                      "fallback_handle": raw_key})


def dyno_logs(rig: AllFeaturesRig) -> str:
    assert rig.supervisor is not None
    return rig.supervisor.log_tails()


def health(rig: AllFeaturesRig) -> subprocess.CompletedProcess[str]:
    """``switchyard health`` with the fleet's own environment, as an operator runs it."""
    return subprocess.run([sys.executable, "-m", "ops", "health"], env=rig.env, capture_output=True, text=True,
                          timeout=HEALTH_BOUND_S, check=False)


def test_every_feature_on_at_once_both_sides_do_real_work(log_budget: list, rig: AllFeaturesRig) -> None:
    assert rig.supervisor is not None
    voices = rig._make_voicy(VOICES, random.Random(14), "features")
    rig.voicy = voices
    fetches = rig._make_cairn(FETCHES, "features")
    for job in fetches:
        rig._publish(job)
    rig.cairn = list(fetches)

    def voices_done() -> bool:
        return all(rig.voicy_api.get_job(j.job_id)["status"] in chaos_count.FINAL_VOICY for j in voices)

    wait_until(lambda: voices_done() and all(rig.cairn_results(j.job_id) for j in fetches), JOBS_BOUND_S,
               f"both sides' jobs done\n{dyno_logs(rig)}")

    # a webhook: fake Strava pushes a new activity to core, core to the pool, the pool imports it
    athlete_id = next(iter(rig.strava._athletes))
    assert demo_webhook.run(rig.core, rig.strava, athlete_id, rig.pool, PROVIDER) == 0, dyno_logs(rig)

    # parse_blob: the pool re-parses what its fetch_source archived
    reparse = parse_blob_job(rig, fetches[0].payload)
    rig.core.enqueue_job("parse_blob", reparse)
    wait_until(lambda: rig.cairn_results(reparse["job_id"]), JOBS_BOUND_S, f"the parse_blob result\n{dyno_logs(rig)}")

    voicy, cairn = chaos_count.count_voicy(rig), chaos_count.count_cairn(rig)
    assert (voicy.completed, voicy.duplicates, voicy.lost) == (VOICES, [], []), voicy.as_dict()
    assert (cairn.completed, cairn.duplicates, cairn.lost) == (FETCHES, [], []), cairn.as_dict()

    # C5 with webhooks on: both provider workers are live at core and say they take webhooks
    def two_live_with_webhooks() -> bool:
        live = rig.core.live_presence(rig.pool)
        return len(live) == 2 and all(rec.get("webhooks") for rec in live.values())

    wait_until(two_live_with_webhooks, PRESENCE_BOUND_S, f"two live presence records with webhooks\n"
               f"{json.dumps(rig.core.presence(rig.pool), default=str)}")

    # Flower, through Sentinel: up, and closed without its credentials
    wait_until(lambda: flower_answers(rig, (FLOWER_USER, FLOWER_PASSWORD)) == 200, FLOWER_BOUND_S, "Flower up")
    assert flower_answers(rig, None) == 401
    # its /metrics reads the queue lengths through Sentinel too: each side's queues, the pool's own
    metrics = httpx.get(f"http://127.0.0.1:{rig.env['PORT']}/metrics", timeout=5.0).text
    assert "switchyard_broker_up 1.0" in metrics, metrics
    for queue in ("gpu", "io", f"provider.{rig.pool}"):
        assert f'switchyard_queue_messages{{queue="{queue}"}}' in metrics, (queue, metrics)

    # JSON logs from every Celery worker, every dyno still running, none exited by itself
    for dyno in rig.supervisor.dynos:
        if dyno.kind in ("gpu", "io", "provider"):
            assert any(line.startswith("{") and json.loads(line).get("levelname")
                       for line in dyno.log_path.read_text().splitlines() if line.startswith("{")), dyno.name
    assert not rig.supervisor.down() and not rig.supervisor.crash_exits(), dyno_logs(rig)
    # H1: the fleet's own verdict is healthy; the log budget (the ``log_budget`` fixture, after the
    # fleet stopped) then reads every process's log: nothing but the baseline may be in it.
    verdict = health(rig)
    assert verdict.returncode == 0 and "HEALTHY" in verdict.stdout, verdict.stdout + verdict.stderr
