"""Every contract 0.7 subject, bucket and message-id format, in one place."""

from __future__ import annotations

# The job kinds (the ``<kind>`` token of job and result subjects) are defined once, with the
# provider contract that declares them; imported here so subject builders and callers use one name.
from workers.providers.kinds import (  # noqa: F401 - re-exported
    BACKFILL,
    FETCH_SOURCE,
    IMPORT_GEAR,
    IMPORT_METRICS,
    JOB_KINDS,
    PARSE_BLOB,
    RECONCILE,
)

JOBS_STREAM = "CAIRN_JOBS"
RESULTS_STREAM = "CAIRN_RESULTS"
EVENTS_STREAM = "CAIRN_EVENTS"
DLQ_STREAM = "CAIRN_DLQ"
WEBHOOKS_STREAM = "CAIRN_WEBHOOKS"
STREAM_NAMES_API = "$JS.API.STREAM.NAMES"  # request {"subject": s} → which stream captures s

PRESENCE_BUCKET = "cairn_worker_presence"
MANIFEST_BUCKET = "cairn_worker_manifests"
RATE_LIMIT_BUCKET = "cairn_rate_limits"
CORE_BUCKET = "cairn_core"
CORE_INFO_KEY = "info"

# Core request/reply responders answered by the pool share one queue group per pool,
# so exactly one instance spends provider budget on each request (the published
# worker used no queue group and every instance answered).
DISCOVER_QUEUE = "discover"
OAUTH_EXCHANGE_QUEUE = "oauth_exchange"
# No cairn.events.* subject is the pool's: the published worker's ``source.deleted_upstream`` is
# outside core's 0.7 template (a deletion travels as a fetch_source: workers.cairn.handlers.webhooks._apply).
NEEDS_REAUTH_EVENT = "cairn.events.external_account.needs_reauth"


# Pool-scoped (0.7): jobs, results (reconcile: account-suffixed), discover, OAuth exchange and
# account lookup carry ``<provider>.<worker_name>``; tokens, creds and presign are provider-scoped.
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


def worker_subject_prefix(key: str) -> str:
    """``cairn.workers.<worker_key>.>``: the pool's own subjects under the permission template."""
    return f"cairn.workers.{key}.>"


def worker_cmd_subject(key: str, command: str) -> str:
    return f"cairn.cmd.worker.{key}.{command}"


def webhook_event_subject(key: str) -> str:
    return f"cairn.webhooks.{key}.event"


def webhook_verify_subject(key: str) -> str:
    return f"cairn.webhooks.{key}.verify"


def durable_name(worker_name: str, kind: str) -> str:
    """Shared by every instance of the pool (CAIRN_JOBS refuses two consumers per filter)."""
    return f"{worker_name}_{kind}".replace(".", "_")


def webhook_durable_name(worker_name: str) -> str:
    return f"{worker_name}__webhook_event"


def presence_key(worker_name: str, instance_id: str) -> str:
    return f"{worker_name}.{instance_id}"


def manifest_key(worker_name: str) -> str:
    return worker_name


def rate_limit_key(provider: str, app_id: str, window: str) -> str:
    """KV key ``<provider>.<app_id>.<window>`` of bucket ``<provider>:<app_id>:<window>``.

    ``app_id`` is the token reply's; without one (older core) pass the pool's
    worker name (contract §3).
    """
    return f"{provider}.{app_id}.{window}"


def rate_limit_bucket(provider: str, app_id: str, window: str) -> str:
    """The bucket's contract name (``:``-separated); the KV key replaces ``:`` by ``.``."""
    return f"{provider}:{app_id}:{window}"


# --- Nats-Msg-Id formats (contract §5) --------------------------------------------------------

def activity_result_msg_id(job_id: str, delivery: int) -> str:
    return f"result:{job_id}:d{delivery}"


def result_msg_id(job_id: str) -> str:
    return f"result:{job_id}"


def reconcile_subjob_msg_id(provider: str, account_id: str, ext_id: str) -> str:
    return f"reconcile:{provider}:{account_id}:{ext_id}"


def segment_result_msg_id(job_id: str, delivery: int) -> str:
    """The second fetch_source result (segments + efforts) of the published worker."""
    return f"result:{job_id}:d{delivery}:seg"


def backfill_subjob_msg_id(provider: str, account_id: str, ext_id: str) -> str:
    return f"backfill:{provider}:{account_id}:{ext_id}"


def webhook_fetch_msg_id(provider: str, owner_id: str, object_id: str) -> str:
    return f"fetch:{provider}:{owner_id}:{object_id}"


def failure_msg_id(provider: str, job_id: str, delivery: int) -> str:
    """Failure envelopes: ``failed:<provider>:<job or ext id>:d<attempt>`` (the published form)."""
    return f"failed:{provider}:{job_id}:d{delivery}"
