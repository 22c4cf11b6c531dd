"""Dev Cairn core: the core side of the provider contract 0.7, for tests and the demo.

``DevCairnCore(nats_url, s3_endpoint).start()`` creates the streams and KV
buckets like core, answers token/creds/presign/lookup requests, ingests results
strictly (claim-check verified) and publishes jobs on pool-scoped subjects.
"""

from __future__ import annotations

from devstack.fakes.cairn_core.accounts import Account, app_id_for
from devstack.fakes.cairn_core.core import DevCairnCore
from devstack.fakes.cairn_core.router import IngestedResult, Rejection
from devstack.fakes.cairn_core.scheduler import PublishedJob

__all__ = ["Account", "DevCairnCore", "IngestedResult", "PublishedJob", "Rejection", "app_id_for"]
