"""Subject names and the strict JobResult decoder, taken from the wire layer.

The names live in ``workers/cairn/contract/subjects.py`` and the protojson codec in
``workers/cairn/contract/wire.py``; the dev core must speak exactly what the workers
speak, so it imports them instead of spelling subjects again. Only the
core-side wildcards (what core *subscribes* to) are defined here.
"""

from __future__ import annotations

from typing import Any

from workers.cairn.contract import subjects as _wire_subjects
from workers.cairn.contract import wire as _wire

# LOCAL (core-side only, so not in workers/cairn/contract/subjects.py): the wildcards core
# subscribes to, covering every provider / pool.
RESULTS_ALL = "cairn.results.>"
TOKENS_ALL = "cairn.tokens.*.*"
CREDS_GET_ALL = "cairn.creds.*.get"
PRESIGN_UPLOAD_ALL = "cairn.blobs.presign_upload.*"
PRESIGN_DOWNLOAD_ALL = "cairn.blobs.presign_download.*"
ACCOUNT_LOOKUP_ALL = "cairn.accounts.lookup.*.*"


def job_subject(kind: str, provider: str, worker_name: str) -> str:
    return _wire_subjects.job_subject(kind, provider, worker_name)


def discover_subject(provider: str, worker_name: str) -> str:
    return _wire_subjects.discover_subject(provider, worker_name)


def oauth_exchange_subject(provider: str, worker_name: str) -> str:
    return _wire_subjects.oauth_exchange_subject(provider, worker_name)


def webhook_event_subject(worker_key: str) -> str:
    return _wire_subjects.webhook_event_subject(worker_key)


def webhook_verify_subject(worker_key: str) -> str:
    return _wire_subjects.webhook_verify_subject(worker_key)


def decode_job_result(data: bytes) -> Any:
    """Strict protojson → ``cairn.worker.v1.JobResult`` (unknown fields are an error)."""
    return _wire.decode_job_result(data)
