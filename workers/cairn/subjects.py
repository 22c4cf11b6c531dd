"""Every contract 0.7 subject, bucket and message-id format, in one place.

Pool-scoped (0.7): jobs ``cairn.jobs.<job>.<provider>.<worker_name>``, results
``cairn.results.<job>.<provider>.<worker_name>`` (reconcile: account-suffixed),
discover ``cairn.discover.<provider>.<worker_name>``, OAuth exchange
``cairn.oauth.<provider>.<worker_name>.exchange``, lookup
``cairn.accounts.lookup.<provider>.<worker_name>``. Tokens, creds and presign
are provider-scoped request/reply subjects.
"""

from __future__ import annotations

JOBS_STREAM = "CAIRN_JOBS"
RESULTS_STREAM = "CAIRN_RESULTS"
WEBHOOKS_STREAM = "CAIRN_WEBHOOKS"

PRESENCE_BUCKET = "cairn_worker_presence"
MANIFEST_BUCKET = "cairn_worker_manifests"
RATE_LIMIT_BUCKET = "cairn_rate_limits"
CORE_BUCKET = "cairn_core"
CORE_INFO_KEY = "info"

FETCH_SOURCE = "fetch_source"
RECONCILE = "reconcile"
PARSE_BLOB = "parse_blob"
IMPORT_GEAR = "import_gear"
IMPORT_METRICS = "import_metrics"
BACKFILL = "backfill"
JOB_KINDS = (FETCH_SOURCE, RECONCILE, PARSE_BLOB, IMPORT_GEAR, IMPORT_METRICS, BACKFILL)


def job_subject(kind: str, provider: str, worker_name: str) -> str:
    return f"cairn.jobs.{kind}.{provider}.{worker_name}"


def result_subject(kind: str, provider: str, worker_name: str) -> str:
    return f"cairn.results.{kind}.{provider}.{worker_name}"


def reconcile_result_subject(provider: str, account_id: str) -> str:
    return f"cairn.results.reconcile.{provider}.{account_id}"


def discover_subject(provider: str, worker_name: str) -> str:
    return f"cairn.discover.{provider}.{worker_name}"


def oauth_exchange_subject(provider: str, worker_name: str) -> str:
    return f"cairn.oauth.{provider}.{worker_name}.exchange"


def account_lookup_subject(provider: str, worker_name: str) -> str:
    return f"cairn.accounts.lookup.{provider}.{worker_name}"


def token_subject(provider: str, op: str) -> str:
    """``op`` is ``get``, ``store`` or ``needs_reauth``."""
    return f"cairn.tokens.{provider}.{op}"


def creds_subject(provider: str) -> str:
    return f"cairn.creds.{provider}.get"


def presign_upload_subject(provider: str) -> str:
    return f"cairn.blobs.presign_upload.{provider}"


def presign_download_subject(provider: str) -> str:
    return f"cairn.blobs.presign_download.{provider}"


def worker_key(worker_name: str, provider: str) -> str:
    return f"{worker_name}-{provider}"


def webhook_event_subject(key: str) -> str:
    return f"cairn.webhooks.{key}.event"


def webhook_verify_subject(key: str) -> str:
    return f"cairn.webhooks.{key}.verify"


def durable_name(worker_name: str, kind: str) -> str:
    """Shared by every instance of the pool (CAIRN_JOBS refuses two consumers per filter)."""
    return f"{worker_name}_{kind}".replace(".", "_")


def presence_key(worker_name: str, instance_id: str) -> str:
    return f"{worker_name}.{instance_id}"


def rate_limit_key(provider: str, app_id: str, window: str) -> str:
    return f"{provider}.{app_id}.{window}"


# --- Nats-Msg-Id formats (contract §5) --------------------------------------------------------

def activity_result_msg_id(job_id: str, delivery: int) -> str:
    return f"result:{job_id}:d{delivery}"


def result_msg_id(job_id: str) -> str:
    return f"result:{job_id}"


def reconcile_subjob_msg_id(provider: str, account_id: str, ext_id: str) -> str:
    return f"reconcile:{provider}:{account_id}:{ext_id}"


def failure_msg_id(provider: str, job_id: str, delivery: int) -> str:
    return f"failed:{provider}:{job_id}:d{delivery}"
