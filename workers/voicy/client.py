"""HTTP client for the Voicy Worker API, on httpx with tenacity retries."""

from __future__ import annotations

import logging
from typing import Any

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, stop_after_delay, wait_exponential_jitter

from workers import dead_peers
from workers.errors import AuthError, PermanentJobError, RetryableJobError, StaleJobError
from workers.voicy.models import (
    Bucket,
    ClaimBody,
    DownloadedBody,
    FailureBody,
    Job,
    JobResponse,
    Source,
    SourceResponse,
    TranscriptBody,
)
from workers.voicy.settings import VoicySettings

log = logging.getLogger(__name__)

RETRY_ATTEMPTS = 5  # total tries of one call on a transient outcome
RETRY_INITIAL_S = 0.2  # first backoff; doubles each try, with jitter
RETRY_MAX_S = 5.0  # cap of one backoff
RETRY_BUDGET_S = 60.0  # no new try starts after this long since the first
DEFAULT_TIMEOUT_S = 300.0  # Voicy's DOWNLOAD_TIMEOUT_MS, used for every API call
# A 404 with one of these is StaleJobError (drop quietly). The server only sends ``job_not_found``;
# the other three are the ones Voicy's client also recognises.
STALE_CODES = frozenset({"job_not_found", "job_not_owned", "job_not_active", "job_cancelled"})
TRANSIENT_STATUSES = frozenset({429})  # besides every 5xx
AUTH_MESSAGE = "Voicy worker token is invalid or disabled (VOICY_WORKER_TOKEN)"


class VoicyApiError(PermanentJobError):
    """A non-retryable 4xx from the Worker API; ``code`` is the server's ``error`` value.

    Voicy's own client reports these as retryable; they are deterministic validation errors,
    so retrying cannot help.
    """

    def __init__(self, message: str, *, status: int, code: str | None) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class _Transient(Exception):
    """Internal: a retryable HTTP outcome (5xx, 429, timeout, connection error)."""


class VoicyClient:
    """One client per process; each method maps its endpoint's statuses to our exception tree.

    As the real server and client do (reference/voicy.md §1, §6.2, §6.8): 401 is ``AuthError``;
    a stale 404 ``StaleJobError``; 5xx, 429, timeouts and connection errors are retried, then
    ``RetryableJobError``; any other 4xx ``VoicyApiError``. The token lives only in the
    ``Authorization`` header; messages name method, path and status, never a header or body.

    ``VoicyClient(settings)`` or ``VoicyClient(base_url, token, timeout_s)``.
    ``transport`` is for tests that want a different httpx transport.
    """

    def __init__(self, base_url: str | VoicySettings, token: str | None = None,
                 timeout_s: float | None = None, retry_attempts: int = RETRY_ATTEMPTS, *,
                 retry_budget_s: float = RETRY_BUDGET_S,
                 transport: httpx.BaseTransport | None = None) -> None:
        if isinstance(base_url, VoicySettings):
            settings = base_url
            base_url, token = settings.api_url, token or settings.token.get_secret_value()
            timeout_s = settings.timeout_s if timeout_s is None else timeout_s
        if not token:
            raise AuthError(AUTH_MESSAGE)
        transport = transport or httpx.HTTPTransport(socket_options=dead_peers.socket_options())  # silent cuts
        self._http = httpx.Client(base_url=base_url.rstrip("/"), transport=transport,
                                  timeout=DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s,
                                  headers={"Authorization": f"Bearer {token}"}, follow_redirects=False)
        self._attempts, self._budget_s = retry_attempts, retry_budget_s

    @classmethod
    def from_settings(cls, settings: VoicySettings) -> VoicyClient:
        return cls(settings)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> VoicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transport -------------------------------------------------------------------------
    def _send(self, method: str, path: str, json: Any = None) -> httpx.Response:
        def once() -> httpx.Response:
            try:
                response = self._http.request(method, path, json=json)
            except httpx.TransportError as exc:
                raise _Transient(f"{method} {path}: {type(exc).__name__}") from None
            if response.status_code >= 500 or response.status_code in TRANSIENT_STATUSES:
                raise _Transient(f"{method} {path}: HTTP {response.status_code}")
            return response

        retrying = Retrying(stop=stop_after_attempt(self._attempts) | stop_after_delay(self._budget_s),
                            wait=wait_exponential_jitter(multiplier=RETRY_INITIAL_S, max=RETRY_MAX_S),
                            retry=retry_if_exception_type(_Transient), reraise=True,
                            before_sleep=lambda state: log.info("Voicy API retry %d: %s", state.attempt_number,
                                                                state.outcome and state.outcome.exception()))
        try:
            return retrying(once)
        except _Transient as exc:
            raise RetryableJobError(f"Voicy API unavailable: {exc}") from None

    def _call(self, method: str, path: str, json: Any = None,
              ok: tuple[int, ...] = (200,)) -> httpx.Response:
        response = self._send(method, path, json)
        log.debug("Voicy API %s %s -> %d", method, path, response.status_code)
        if response.status_code in ok:
            return response
        code = _error_code(response)
        if response.status_code == 401:
            raise AuthError(AUTH_MESSAGE)
        if response.status_code == 404 and code in STALE_CODES:
            raise StaleJobError(f"{method} {path}: {code}")
        raise VoicyApiError(f"Voicy API {method} {path}: HTTP {response.status_code} {code or ''}".rstrip(),
                            status=response.status_code, code=code)

    def _job(self, response: httpx.Response) -> Job | None:
        if response.status_code != 200:
            return None
        try:
            return JobResponse.model_validate(response.json()).job
        except ValueError:  # includes pydantic's ValidationError and a non-JSON body
            raise RetryableJobError(f"Voicy API {response.request.url.path}: 200 without a job object") from None

    def _job_call(self, method: str, path: str, json: Any = None) -> Job:
        job = self._job(self._call(method, path, json))
        assert job is not None  # _call only returns a 200 here
        return job

    # --- claims ------------------------------------------------------------------------------
    def claim_download(self, bucket: Bucket = "oldest") -> Job | None:
        """200 → the job (now ``downloading``, attempts incremented); 204 → none."""
        return self._job(self._call("POST", "/jobs/claim-download", ClaimBody(bucket=bucket).body(),
                                    ok=(200, 204)))

    def claim_ready(self, bucket: Bucket = "oldest") -> Job | None:
        """200 → a ready or stale job of ours, now ``transcribing``; 204 and a plain 404
        (a server without the route, §6.2) mean none."""
        return self._job(self._call("POST", "/jobs/claim-ready", ClaimBody(bucket=bucket).body(),
                                    ok=(200, 204, 404)))

    def claim_legacy(self) -> Job | None:
        """``POST /jobs/claim`` (§1.3): a ready job, else a legacy ``queued`` job with a sourceUrl."""
        return self._job(self._call("POST", "/jobs/claim", ok=(200, 204)))

    # --- one job ---------------------------------------------------------------------------------
    def get_job(self, job_id: str) -> Job:
        return self._job_call("GET", f"/jobs/{job_id}")

    def source(self, job_id: str) -> Source:
        response = self._call("GET", f"/jobs/{job_id}/source")
        try:
            return SourceResponse.model_validate(response.json()).source
        except ValueError:
            raise RetryableJobError(f"Voicy API /jobs/{job_id}/source: 200 without a source") from None

    def downloaded(self, job_id: str, local_source_path: str) -> Job:
        body = DownloadedBody(local_source_path=local_source_path).body()
        return self._job_call("POST", f"/jobs/{job_id}/downloaded", body)

    def transcribe(self, job_id: str) -> Job:
        return self._job_call("POST", f"/jobs/{job_id}/transcribe")

    def heartbeat(self, job_id: str) -> Job:
        return self._job_call("POST", f"/jobs/{job_id}/heartbeat")

    def progress(self, job_id: str, body: TranscriptBody) -> Job:
        """A partial transcript; refused locally (``PermanentJobError``) if over the server's limits."""
        body.check_uploadable()
        return self._job_call("POST", f"/jobs/{job_id}/progress", body.body())

    def result(self, job_id: str, body: TranscriptBody) -> Job:
        """The final transcript (``text`` may be empty); size-guarded like Voicy's client."""
        body.check_uploadable()
        return self._job_call("POST", f"/jobs/{job_id}/result", body.body())

    def failure(self, job_id: str, error: str, *, retryable: bool) -> Job:
        """Report a failure; ``error`` is redacted (Voicy's rules + our secrets) and cut to 2000."""
        return self._job_call("POST", f"/jobs/{job_id}/failure",
                              FailureBody(error=error, retryable=retryable).body())


def _error_code(response: httpx.Response) -> str | None:
    try:
        payload = response.json()
    except ValueError:
        return None
    code = payload.get("error") if isinstance(payload, dict) else None
    return code if isinstance(code, str) else None
