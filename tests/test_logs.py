"""Logs: human by default, JSON with LOG_FORMAT=json, and redacted either way (S1)."""

from __future__ import annotations

import json
import subprocess
import sys

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
