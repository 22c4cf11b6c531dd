"""Proto messages for providers, looked up by name so providers do not depend on the stub layout.

Providers build ``cairn.worker.v1.WorkerEvent`` messages as protojson dicts
(readable, testable) and turn them into messages here, strictly: a field
outside the contract fails in the pool, not at core.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import descriptor_pool, json_format, message_factory

PB_PACKAGE = "workers.cairn.contract.pb"
WORKER_EVENT = "cairn.worker.v1.WorkerEvent"
# A missing sample in a float stream column: NaN is core's per-sample gap marker (reference §1.13), and
# protojson spells a NaN double as the *string* "NaN" (§1); ParseDict, like core's parser, refuses a bare
# float NaN, so a provider's protojson dict carries this, never ``math.nan``.
STREAM_GAP = "NaN"


def activity_type_fields(kind: str, discipline: str, ebike: bool, virtual: bool) -> dict[str, Any]:
    """An activity payload's type fields in protojson, from a provider's classification of its sport
    (``ACTIVITY_TYPE_<kind>``, ``DISCIPLINE_<discipline>`` when there is one, the two flags only when set)."""
    fields: dict[str, Any] = {"type": f"ACTIVITY_TYPE_{kind}"}
    if discipline:
        fields["discipline"] = f"DISCIPLINE_{discipline}"
    if virtual:
        fields["isVirtual"] = True
    if ebike:
        fields["isEbike"] = True
    return fields


def ref(provider: str, user_id: str, account_id: str, external_id: str) -> dict[str, Any]:
    """One entity's ``cairn.worker.v1.ExternalRef`` in protojson (the account only when the job names one)."""
    out = {"userId": user_id, "provider": provider, "externalId": external_id}
    if account_id:
        out["externalAccountId"] = account_id
    return out


def proto_class(full_name: str) -> type[Any]:
    """The generated class of ``full_name`` (e.g. ``cairn.worker.v1.JobResult``).

    Looked up by proto name in the descriptor pool after importing every
    ``*_pb2`` module under ``workers.cairn.contract.pb``, so providers do not depend on
    how the stubs are laid out on disk.
    """
    package = importlib.import_module(PB_PACKAGE)
    if not getattr(package, "_switchyard_loaded", False):
        for info in pkgutil.walk_packages(package.__path__, PB_PACKAGE + "."):
            if info.name.endswith("_pb2"):
                importlib.import_module(info.name)
        package._switchyard_loaded = True  # type: ignore[attr-defined]
    descriptor = descriptor_pool.Default().FindMessageTypeByName(full_name)
    return message_factory.GetMessageClass(descriptor)


def worker_events(wire_events: Sequence[Mapping[str, Any]]) -> list[Any]:
    """protojson ``WorkerEvent`` dicts → messages, strictly (unknown fields raise)."""
    cls = proto_class(WORKER_EVENT)
    return [json_format.ParseDict(dict(event), cls(), ignore_unknown_fields=False)
            for event in wire_events]
