"""The job kinds of contract §3, and the consumer kinds beside them: the one definition every layer imports.

A kind is the token after ``cairn.jobs.`` in a job subject
(``cairn.jobs.<kind>.<provider>.<worker_name>``). It lives here, with the
provider contract, because a provider declares which kinds it serves
(``Capabilities.jobs``) and must not import the NATS layer to do so;
``workers/cairn/contract/subjects.py`` imports these names to build subjects, and the
handlers, admission, the conformance check and the dev tools name kinds
through them, never as typed strings.

A *consumer* kind names what a bridge consumer pulls and admission reads; the
job kinds are consumer kinds of ``CAIRN_JOBS``, and ``WEBHOOK_EVENT`` is the
one of ``CAIRN_WEBHOOKS`` (a provider's push events, contract §9a).
"""

from __future__ import annotations

FETCH_SOURCE = "fetch_source"
RECONCILE = "reconcile"
PARSE_BLOB = "parse_blob"
IMPORT_GEAR = "import_gear"
IMPORT_METRICS = "import_metrics"
BACKFILL = "backfill"
JOB_KINDS = (FETCH_SOURCE, RECONCILE, PARSE_BLOB, IMPORT_GEAR, IMPORT_METRICS, BACKFILL)
WEBHOOK_EVENT = "webhook_event"  # the consumer kind of CAIRN_WEBHOOKS, not a job subject's kind
