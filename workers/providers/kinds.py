"""The job kinds of contract §3 and the consumer kinds beside them: the one definition every layer imports."""

from __future__ import annotations

# A job kind is the token after ``cairn.jobs.`` in a subject. It lives with the provider contract
# because a provider declares the kinds it serves (``Capabilities.jobs``) without importing NATS.
FETCH_SOURCE = "fetch_source"
RECONCILE = "reconcile"
PARSE_BLOB = "parse_blob"
IMPORT_GEAR = "import_gear"
IMPORT_METRICS = "import_metrics"
BACKFILL = "backfill"
JOB_KINDS = (FETCH_SOURCE, RECONCILE, PARSE_BLOB, IMPORT_GEAR, IMPORT_METRICS, BACKFILL)
WEBHOOK_EVENT = "webhook_event"  # the consumer kind of CAIRN_WEBHOOKS, not a job subject's kind
