"""The Cairn benchmark's baseline: a minimal single-process nats-py worker doing the same claim-check.

``python -m bench.cairn_baseline`` (configured by the same ``CAIRN_*`` variables
as the fleet). One asyncio loop, no Celery, no Redis, no leases, no shared
rate-limit budget, no in_progress ticks: it pulls ``fetch_source`` jobs from the
pool's durable consumer on CAIRN_JOBS (the same durable and config the bridge
creates), and for each job does the wire work a fleet task does:

1. token get from core (``cairn.tokens.<provider>.get``);
2. Strava activity detail + streams (the same endpoints and query the provider uses);
3. the dataset-1 raw archive (the provider's own ``build_archive``), presigned
   (kind ``raw``) and PUT;
4. the provider's own parser over that archive, the activity pointed at its
   raw blob, the full ``JobResult`` strictly encoded, presigned (kind
   ``result``), PUT, and the envelope (stamp + ``payload_ref``) published with
   ``Nats-Msg-Id: result:<job_id>:d<n>``;
5. ack (NAK with no delay on any error, so a benchmark run never loses a job).

Why reuse the provider's archive/parser functions: the CPU spent per job must
be the same as the fleet's, so the comparison measures the fleet's
orchestration overhead (Celery, Redis leases, result backend, the bridge hop,
the KV rate limiter), not a different amount of work. It prints
``baseline ready`` once bound, and exits on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import signal
import sys
from typing import Any

import httpx
import nats
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError

from bridges.cairn.consumers import JobConsumer, consumer_config
from workers.cairn.contract import subjects, wire
from workers.cairn.settings import load_cairn_settings
from workers.config import load_settings
from workers.providers.strava.client import API_PREFIX, STREAM_KEYS
from workers.providers.strava.dataset import CONTENT_TYPE, PARSER_VERSION, build_archive, parse_archive
from workers.providers.strava.settings import StravaSettings

log = logging.getLogger("bench.cairn_baseline")

DEFAULT_MAX_IN_FLIGHT = 32
FETCH_BATCH_MAX = 32  # one pull request asks for up to this many messages (bounded by free slots)
FETCH_WAIT_S = 1.0
REQUEST_TIMEOUT_S = 5.0
HTTP_TIMEOUT_S = 30.0
HTTP_MAX_CONNECTIONS = 64
PUBLISH_TIMEOUT_S = 10.0
RESULT_CONTENT_TYPE = "application/json"
READY_LINE = "baseline ready"


class BaselineWorker:
    """Pull → fetch → archive → claim-check → publish → ack, ``max_in_flight`` jobs at a time."""

    def __init__(self, settings: Any, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        self.settings = settings
        self.provider = str(settings.provider)
        self.pool = str(settings.worker_name)
        self.api = load_settings(StravaSettings).base_url + API_PREFIX  # CAIRN_STRAVA_BASE_URL
        self.stamp = {"workerName": self.pool, "workerVersion": PARSER_VERSION,
                      "workerPackage": str(settings.worker_package)}
        self.max_in_flight = max_in_flight
        self.done = 0
        self.failed = 0
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        self.nc = await nats.connect(self.settings.nats_url, name=f"bench-baseline-{self.pool}")
        self.js = self.nc.jetstream()
        self.http = httpx.AsyncClient(timeout=HTTP_TIMEOUT_S, limits=httpx.Limits(
            max_connections=HTTP_MAX_CONNECTIONS, max_keepalive_connections=HTTP_MAX_CONNECTIONS))
        kind = subjects.FETCH_SOURCE
        consumer = JobConsumer(kind, subjects.job_subject(kind, self.provider, self.pool),
                               subjects.durable_name(self.pool, kind))
        await self.js.add_consumer(subjects.JOBS_STREAM, consumer_config(
            consumer, float(self.settings.ack_wait_s), int(self.settings.max_deliver)))
        sub = await self.js.pull_subscribe_bind(durable=consumer.durable, stream=subjects.JOBS_STREAM)
        slots = asyncio.Semaphore(self.max_in_flight)
        running: set[asyncio.Task[None]] = set()
        print(READY_LINE, flush=True)
        try:
            while not self._stop.is_set():
                await slots.acquire()
                free = 1
                while free < FETCH_BATCH_MAX and not slots.locked():  # take every free slot at once
                    await slots.acquire()
                    free += 1
                try:
                    msgs = await sub.fetch(free, timeout=FETCH_WAIT_S)
                except (TimeoutError, NatsTimeoutError):
                    msgs = []
                for _ in range(free - len(msgs)):
                    slots.release()
                for msg in msgs:
                    task = asyncio.create_task(self._job(msg, slots))
                    running.add(task)
                    task.add_done_callback(running.discard)
        finally:
            if running:
                await asyncio.wait(running, timeout=PUBLISH_TIMEOUT_S)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            await self.http.aclose()
            await self.nc.close()

    async def _job(self, msg: Msg, slots: asyncio.Semaphore) -> None:
        try:
            await self._fetch_source(msg)
            await msg.ack()
            self.done += 1
        except Exception as exc:  # noqa: BLE001 - a benchmark must not drop jobs: redeliver
            self.failed += 1
            log.warning("job seq %s failed: %s", msg.metadata.sequence.stream, type(exc).__name__)
            with contextlib.suppress(Exception):
                await msg.nak()
        finally:
            slots.release()

    async def _request(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        reply = await self.nc.request(subject, json.dumps(body, separators=(",", ":")).encode(),
                                      timeout=REQUEST_TIMEOUT_S)
        if (reply.headers or {}).get("Nats-Error"):
            raise RuntimeError(f"core refused {subject}")
        data = json.loads(reply.data)
        if not isinstance(data, dict) or data.get("error"):
            raise RuntimeError(f"core error on {subject}")
        return data

    async def _get(self, path: str, token: str, params: dict[str, str] | None = None) -> Any:
        response = await self.http.get(self.api + path, params=params,
                                       headers={"Authorization": f"Bearer {token}"})
        response.raise_for_status()
        return response.json()

    async def _upload(self, kind: str, body: bytes, content_type: str, user_id: str = "") -> str:
        request: dict[str, Any] = {"provider": self.provider, "kind": kind, "content_type": content_type,
                                   "content_length": len(body), "content_sha256": hashlib.sha256(body).hexdigest()}
        if user_id:
            request["user_id"] = user_id
        presigned = await self._request(subjects.presign_upload_subject(self.provider), request)
        headers = {k: str(v) for k, v in (presigned.get("required_headers") or {}).items() if k.lower() != "host"}
        response = await self.http.request(str(presigned.get("method") or "PUT"), presigned["url"],
                                           content=body, headers=headers)
        response.raise_for_status()
        return str(presigned["blob_id"])

    async def _fetch_source(self, msg: Msg) -> None:
        job = json.loads(msg.data)
        ext_id = str(job["ext_id"])
        tokens = await self._request(subjects.token_subject(self.provider, "get"), {"account_id": job["account_id"]})
        token = str(tokens["access_token"])
        activity = await self._get(f"/activities/{ext_id}", token)
        streams = None
        if job.get("fetch_streams"):
            streams = await self._get(f"/activities/{ext_id}/streams", token,
                                      {"keys": ",".join(STREAM_KEYS), "key_by_type": "true"})
        archive = build_archive(activity, streams, [], worker_name=self.pool, worker_version=PARSER_VERSION,
                                package=self.stamp["workerPackage"])
        raw_blob_id = await self._upload("raw", archive, CONTENT_TYPE, str(job["user_id"]))
        _, events = parse_archive(archive, user_id=str(job["user_id"]), account_id=str(job["account_id"]),
                                  ext_id=ext_id)
        for event in events:
            if "activity" in event:
                event["activity"].update(rawBlobId=raw_blob_id, rawSizeBytes=str(len(archive)),
                                         rawContentType=CONTENT_TYPE)
        body = wire.encode_result(wire.result_from_dict({**self.stamp, "events": events}))
        blob_id = await self._upload("result", body, RESULT_CONTENT_TYPE)
        envelope = {**self.stamp, "payloadRef": {"blobId": blob_id, "sizeBytes": str(len(body)),
                                                 "contentType": RESULT_CONTENT_TYPE,
                                                 "contentSha256": hashlib.sha256(body).hexdigest()}}
        msg_id = subjects.activity_result_msg_id(str(job.get("job_id") or f"ext-{ext_id}"),
                                                 int(msg.metadata.num_delivered))
        await self.js.publish(subjects.result_subject(subjects.FETCH_SOURCE, self.provider, self.pool),
                              wire.encode_result(wire.result_from_dict(envelope)),
                              timeout=PUBLISH_TIMEOUT_S, headers={"Nats-Msg-Id": msg_id})


async def _main(max_in_flight: int) -> int:
    worker = BaselineWorker(load_cairn_settings(), max_in_flight)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    await worker.run()
    print(f"baseline stopped: {worker.done} done, {worker.failed} failed", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.cairn_baseline")
    parser.add_argument("--max-in-flight", type=int, default=DEFAULT_MAX_IN_FLIGHT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # request URLs carry presign signatures (S1)
    return asyncio.run(_main(args.max_in_flight))


if __name__ == "__main__":
    sys.exit(main())
