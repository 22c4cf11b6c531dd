"""The partition run's log budget (H1): what cutting hosts off mid-job is *expected* to log.

``python -m bench partitions`` ends, like every run that starts the fleet, by reading
every dyno's log (``devstack.infra.log_budget``). A partition is an outage seen
from one host, so the chaos run's outage entries apply (``bench.chaos_budget``),
plus the lines only a partition provokes, each with its reason; anything else is a
finding, counted in the figures and failing the run's targets.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from bench import chaos_budget
from devstack.infra import log_budget
from devstack.infra.log_budget import Allow, Budget

GPU_LINK = "python -m bench partitions: gpu-link (a gpu host's link down past the lease TTL)"
TO_NATS = "python -m bench partitions: provider-nats, cairn-bridge-nats (a host DROPped from NATS)"
TO_REDIS = "python -m bench partitions: voicy-bridge-redis, beat-redis (a host DROPped from Redis)"

ALLOW: tuple[Allow, ...] = (
    # --- the cut gpu host, back on the network: its lease is someone else's now (LeaseKeeper.fence)
    Allow(r"lease lost for job \S+$", logs=("gpu",),
          reason="the cut gpu host's keeper (or its fence) finds the job's lease taken by the other gpu host",
          provoked_by=GPU_LINK),
    Allow(r"job \S+: lease lost, leaving the job to its new owner", logs=("gpu",),
          reason="the cut gpu host drops its late transcription instead of posting it: the point of the fence",
          provoked_by=GPU_LINK),
    Allow(r"lease of job \S+ unconfirmed for \d+s \(\w+\): not ours to report", logs=("gpu",),
          reason="the cut gpu host's fence could not reach Redis within its bound: it posts nothing",
          provoked_by=GPU_LINK),
    # --- the provider host cut from NATS: the shared rate budget (a NATS KV) cannot be read
    Allow(r"strava (segment|gear) \S+ lookup skipped: BudgetUnavailable", logs=("provider",),
          reason="optional detail whose budget cannot be reserved is skipped, as any failed segment or gear "
          "lookup is (workers/providers/strava/segments.py): the activity is imported without it",
          provoked_by=TO_NATS),
    # --- the Cairn bridge cut from NATS: its acks do not arrive; the ledger settles the redeliveries
    Allow(r"ack for seq \d+ not sent \(TimeoutError\); its redelivery applies the recorded outcome",
          logs=("cairn_bridge",), reason="the bridge cannot reach NATS to ack: JetStream redelivers after AckWait "
          "and the bridge applies the outcome the ledger recorded (no second run)", provoked_by=TO_NATS),
)


def scan(logs: Iterable[Path]) -> Budget:
    """Every dyno's log against the baseline, the chaos run's outage entries and the partitions' own."""
    return log_budget.scan(logs, [*log_budget.baseline(), *chaos_budget.ALLOW, *ALLOW])
