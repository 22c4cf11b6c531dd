"""Logs: human by default, JSON with LOG_FORMAT=json, and redacted either way (S1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable

import pytest

from tests.kit.celery_worker import CeleryWorker
from tests.kit.waiting import wait_until

WORKER_LOG_TIMEOUT_S = 30.0

SCRIPT = """
import logging, httpx
from workers.logs import setup_logging, register_secret
setup_logging("DEBUG")
register_secret("voicy-token-SECRET-123")
log = logging.getLogger("switchyard.test")
log.info("job %s stage %s took %.2fs attempt %d", "665f0c", "download", 1.5, 2)
log.warning("token voicy-token-SECRET-123 in https://api.telegram.org/file/bot123:AAE_secret-x/voice/a.oga")
log.warning("presigned https://s3/b/k?X-Amz-Signature=deadbeef&X-Amz-Credential=AKIA/x")
logging.getLogger("httpx").info("HTTP Request: GET https://api.telegram.org/bot123:AAE_secret-x/getFile")
try:
    raise RuntimeError("boom voicy-token-SECRET-123")
except RuntimeError:
    log.exception("failed")
"""


def _run(env_format: str | None) -> str:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "."}
    if env_format:
        env["LOG_FORMAT"] = env_format
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                          check=True).stderr


def test_json_format_is_one_object_per_line_with_job_fields_and_no_secrets() -> None:
    out = _run("json")
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert records[0]["message"] == "job 665f0c stage download took 1.50s attempt 2"
    assert records[0]["levelname"] == "INFO"
    for secret in ("voicy-token-SECRET-123", "AAE_secret-x", "deadbeef", "AKIA"):
        assert secret not in out
    assert "HTTP Request" not in out  # httpx is quieted to WARNING
    assert any("boom" in (r.get("exc_info") or r.get("message", "") + str(r)) for r in records)


def test_human_format_is_redacted_too() -> None:
    out = _run(None)
    assert "job 665f0c stage download took 1.50s attempt 2" in out
    assert "<redacted>" in out
    for secret in ("voicy-token-SECRET-123", "AAE_secret-x", "deadbeef"):
        assert secret not in out


@pytest.mark.slow
@pytest.mark.parametrize("log_format", ["human", "json"])
def test_a_celery_worker_prints_each_record_once_in_the_chosen_format(
        log_format: str, fresh_redis: str, celery_workers: Callable[..., CeleryWorker]) -> None:
    """Pool children log through Celery's handlers (redacting, JSON when asked), never twice.

    The task is a real ``voicy.download`` for a job whose lease was never granted: the
    pipeline logs one line (``already owned``) from a pool child and returns.
    """
    from celery import Celery

    secret = f"voicy-token-SECRET-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOICY_", "CAIRN_", "LOG_"))}
    env.update({"REDIS_URL": fresh_redis, "VOICY_WORKER_API_URL": "http://127.0.0.1:9/worker/v1",
                "VOICY_WORKER_TOKEN": secret, "LOG_FORMAT": log_format, "PYTHONPATH": "."})
    worker = celery_workers("io", env)
    job_id = f"job-{uuid.uuid4().hex[:12]}"
    probe = Celery(broker=fresh_redis)
    try:
        probe.send_task("voicy.download", args=[job_id, "never-granted"], queue="io")
        wait_until(lambda: "succeeded" in worker.log() and job_id in worker.log(), WORKER_LOG_TIMEOUT_S,
                   "the download task's log lines")
    finally:
        probe.close()
    out = worker.log()
    mine = [line for line in out.splitlines() if "already owned" in line]
    assert len(mine) == 1, mine  # once: not again through the stderr proxy as a WARNING
    if log_format == "json":
        record = json.loads(mine[0])
        assert record["name"] == "workers.voicy.pipeline" and record["levelname"] == "INFO"
        assert record["processName"].startswith("ForkPoolWorker")
        for line in out.splitlines():  # every record of the task, Celery's own included, is JSON
            if job_id in line:
                json.loads(line)
    assert secret not in out


OAUTH_CODE = "4f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39"  # Strava's shape: 40 hex characters


@pytest.mark.parametrize("text", [
    f"GET http://localhost/exchange_token?state=&code={OAUTH_CODE}&scope=read,activity:read_all",  # Strava's redirect
    f"https://app.example/cb?code={OAUTH_CODE}",
    f"https://app.example/cb?state=s1&code={OAUTH_CODE}",
    f"https://app.example/cb#state=s1&code={OAUTH_CODE}",  # response_mode=fragment
    f"https://app.example/cb?CODE={OAUTH_CODE}&state=s1",
    f"client_id=1&client_secret=x&code={OAUTH_CODE}&grant_type=authorization_code",  # a token request's form
    f"code={OAUTH_CODE}&grant_type=authorization_code",
    f"body b'code={OAUTH_CODE}&client_id=1' refused",
])
def test_an_oauth_code_in_a_url_query_or_form_body_is_redacted(text: str) -> None:
    from workers.logs import redact

    out = redact(text)
    assert OAUTH_CODE not in out and "code=<redacted>" in out.lower()


def test_a_nats_error_keeps_its_codes() -> None:
    """NATS errors name their status and JetStream error code as ``code=404 err_code=10014``: not secrets."""
    from nats.js.errors import NotFoundError, ServiceUnavailableError

    from workers.logs import describe, redact

    assert describe(NotFoundError(code=404, err_code=10014, description="consumer not found")) == \
        "NotFoundError: nats: NotFoundError: code=404 err_code=10014 description='consumer not found'"
    line = "NATS unavailable (nats: ServiceUnavailableError: code=503 err_code=10008 description='x')"
    assert redact(line) == line
    assert redact(str(ServiceUnavailableError(code=503))) == str(ServiceUnavailableError(code=503))
