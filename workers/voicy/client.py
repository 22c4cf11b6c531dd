"""HTTP client for the Voicy Worker API, on httpx with tenacity retries.

Status handling follows the real server and client (reference/voicy.md §1,
§6.2): 401 means the token is invalid or disabled; a 404 with one of the
"stale job" codes means the job is no longer ours; 5xx, timeouts and
connection errors are retried with bounded backoff and then surface as
retryable; other 4xx are permanent. No message ever includes the token.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
from tenacity import (Retrying, retry_if_exception_type, stop_after_attempt,
                      wait_exponential_jitter)

from workers.errors import AuthError, PermanentJobError, RetryableJobError, StaleJobError
from workers.voicy.models import FailureBody, Job, Source, TranscriptBody
from workers.voicy.settings import VoicySettings

log = logging.getLogger(__name__)

RETRY_ATTEMPTS = 5
RETRY_INITIAL_S = 0.2
RETRY_MAX_S = 5.0
STALE_CODES = frozenset({"job_not_found", "job_not_owned", "job_not_active", "job_cancelled"})


class _Transient(Exception):
    """Internal: a retryable HTTP outcome (5xx, timeout, connection error)."""


class VoicyClient:
    """One client per process; methods map each endpoint's statuses to our exception tree."""

    def __init__(self, base_url: str, token: str, timeout_s: float,
                 retry_attempts: int = RETRY_ATTEMPTS) -> None:
        self._http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s,
                                  headers={"Authorization": f"Bearer {token}"})
        self._attempts = retry_attempts

    @classmethod
    def from_settings(cls, settings: VoicySettings) -> VoicyClient:
        return cls(settings.api_url, settings.token.get_secret_value(), settings.timeout_s)

    def close(self) -> None:
        self._http.close()

    # --- transport -------------------------------------------------------------------------
    def _send(self, method: str, path: str, json: Any = None) -> httpx.Response:
        def once() -> httpx.Response:
            try:
                response = self._http.request(method, path, json=json)
            except httpx.TransportError as exc:
                raise _Transient(f"{method} {path}: {type(exc).__name__}") from None
            if response.status_code >= 500:
                raise _Transient(f"{method} {path}: HTTP {response.status_code}")
            return response

        retrying = Retrying(stop=stop_after_attempt(self._attempts),
                            wait=wait_exponential_jitter(multiplier=RETRY_INITIAL_S, max=RETRY_MAX_S),
                            retry=retry_if_exception_type(_Transient), reraise=True)
        try:
            return retrying(once)
        except _Transient as exc:
            raise RetryableJobError(f"Voicy API unavailable: {exc}") from None

    def _call(self, method: str, path: str, json: Any = None, ok: tuple[int, ...] = (200,)) -> httpx.Response:
        response = self._send(method, path, json)
        if response.status_code in ok:
            return response
        code = _error_code(response)
        if response.status_code == 401:
            raise AuthError("Voicy rejected VOICY_WORKER_TOKEN (invalid or disabled): " + (code or "401"))
        if response.status_code == 404 and code in STALE_CODES:
            raise StaleJobError(f"{method} {path}: {code}")
        raise PermanentJobError(f"{method} {path}: HTTP {response.status_code} {code or ''}".strip())

    def _job(self, response: httpx.Response) -> Job | None:
        if response.status_code != 200:
            return None
        return Job.model_validate(response.json()["job"])

    # --- endpoints ---------------------------------------------------------------------------
    def claim_download(self, bucket: str) -> Job | None:
        return self._job(self._call("POST", "/jobs/claim-download", {"bucket": bucket}, ok=(200, 204)))

    def claim_ready(self, bucket: str) -> Job | None:
        """200 is a job; 204 and a plain 404 (an older server without the route) mean none."""
        return self._job(self._call("POST", "/jobs/claim-ready", {"bucket": bucket}, ok=(200, 204, 404)))

    def get_job(self, job_id: str) -> Job:
        return self._job(self._call("GET", f"/jobs/{job_id}"))  # type: ignore[return-value]

    def source(self, job_id: str) -> Source:
        return Source.model_validate(self._call("GET", f"/jobs/{job_id}/source").json()["source"])

    def downloaded(self, job_id: str, local_source_path: str) -> Job:
        return self._job(self._call("POST", f"/jobs/{job_id}/downloaded",  # type: ignore[return-value]
                                    {"localSourcePath": local_source_path}))

    def transcribe(self, job_id: str) -> Job:
        return self._job(self._call("POST", f"/jobs/{job_id}/transcribe"))  # type: ignore[return-value]

    def heartbeat(self, job_id: str) -> Job:
        return self._job(self._call("POST", f"/jobs/{job_id}/heartbeat"))  # type: ignore[return-value]

    def progress(self, job_id: str, body: TranscriptBody) -> Job:
        return self._job(self._call("POST", f"/jobs/{job_id}/progress", body.body()))  # type: ignore[return-value]

    def result(self, job_id: str, body: TranscriptBody) -> Job:
        return self._job(self._call("POST", f"/jobs/{job_id}/result", body.body()))  # type: ignore[return-value]

    def failure(self, job_id: str, error: str, *, retryable: bool) -> Job:
        body = FailureBody(error=error[:2000], retryable=retryable).body()
        return self._job(self._call("POST", f"/jobs/{job_id}/failure", body))  # type: ignore[return-value]


def _error_code(response: httpx.Response) -> str | None:
    try:
        payload = response.json()
    except ValueError:
        return None
    return payload.get("error") if isinstance(payload, dict) else None
