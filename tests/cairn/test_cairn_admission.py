"""Admission, the one decision point for every Cairn message (issue 9), against a real Redis.

The delivery metadata is plain data (what JetStream reports for a delivery);
the message's history is read by the bridge's own ``RedisRecall`` from a real
``redis-server``, written by the real ledger, lease and failure-count code.

Observed defect 1 is pinned here at the source: JSON nested deeply enough to
raise ``RecursionError`` and a ``min_parser_version`` that is not ``N.M`` used to
escape to the bridge's catch-all and be NAKed for ever; they are poison now
(envelope + term). The property tests feed admission arbitrary bytes and
arbitrary JSON and require exactly one verdict, never an exception.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridges.cairn.admission import Adopt, DeliveryMeta, Dispatch, RedisRecall, Rules, Settle, admit, gives_up, job_kind
from workers.cairn.contract.jobs import parse_job
from workers.cairn.contract.subjects import JOB_KINDS, JOBS_STREAM
from workers.cairn.disposition import ack, nak, term
from workers.cairn.outcomes import LEASE_NAMESPACE, MessageKey, OutcomeLedger, failures_key
from workers.lease import Leases, new_token

PARSER_VERSION = "1.4"
KINDS = {k: job_kind(k, PARSER_VERSION) for k in JOB_KINDS}
RULES = Rules(term_after_deliveries=5, max_deliver=-1)
DEEP = 100_000  # far beyond json's recursion limit
UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                          HealthCheck.too_slow])


def fetch_job(**extra: Any) -> dict[str, Any]:
    return {"job_id": f"job-{uuid.uuid4().hex[:8]}", "account_id": "acct-1", "user_id": "user-1",
            "provider": "strava", "ext_id": "123", **extra}


def blob_job(version: Any) -> dict[str, Any]:
    return fetch_job(blob={"url": "https://s3.local/x", "fallback_handle": "users/u/strava/k"},
                     min_parser_version=version)


class Admitter:
    """Calls ``admit`` the way the bridge does, with the bridge's Redis-backed recall."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sync = redis.Redis.from_url(url)
        self.leases = Leases(self.sync, LEASE_NAMESPACE)

    def meta(self, kind: str = "fetch_source", delivered: int = 1, seq: int | None = None) -> DeliveryMeta:
        return DeliveryMeta(kind=kind, stream=JOBS_STREAM, seq=seq or uuid.uuid4().int % 10**9 + 1,
                            stamp=1_770_000_000.123456, delivered=delivered,
                            subject=f"cairn.jobs.{kind}.strava.pool")

    def __call__(self, raw: bytes, meta: DeliveryMeta, rules: Rules = RULES, url: str | None = None) -> Any:
        async def run() -> Any:
            client = aioredis.Redis.from_url(url or self.url)
            try:
                return await admit(raw, meta, kinds=KINDS, recall=RedisRecall(client, self.leases.key), rules=rules)
            finally:
                await client.aclose()
        return asyncio.run(run())


@pytest.fixture()
def admitter(fresh_redis: str) -> Admitter:
    return Admitter(fresh_redis)


def assert_one_verdict(verdict: object, meta: DeliveryMeta) -> None:
    """Exactly one verdict, and a coherent one."""
    assert isinstance(verdict, (Dispatch, Adopt, Settle)), verdict
    if isinstance(verdict, Settle):
        d = verdict.disposition
        if d.action == "term" and not verdict.recorded:
            assert verdict.envelope is not None and verdict.envelope.code  # never a term without its envelope
            assert verdict.envelope.ref.get("job_id")  # the envelope's msg-id names something
            assert len(verdict.envelope.message) < 1000
        if d.action == "nak":
            assert d.delay_s and d.delay_s > 0  # never an instant NAK
    if isinstance(verdict, Dispatch):
        assert meta.kind in KINDS
        json.dumps(verdict.payload)  # travels as a task argument
        parse_job(meta.kind, verdict.payload)  # the task rebuilds what admission parsed


# --------------------------------------------------------------------------- observed defect 1
@pytest.mark.parametrize("raw", [b"[" * DEEP + b"]" * DEEP, b'{"a":' * DEEP + b"1" + b"}" * DEEP,
                                 b'{"job_id": "j", "x": ' + b"[" * DEEP + b"]" * DEEP + b"}"])
def test_deeply_nested_json_is_poison_with_an_envelope(admitter: Admitter, raw: bytes) -> None:
    for delivered in (1, 3):
        verdict = admitter(raw, admitter.meta(delivered=delivered))
        assert isinstance(verdict, Settle) and verdict.disposition.action == "term", verdict
        assert verdict.envelope is not None and verdict.envelope.code == "bad_payload"


@pytest.mark.parametrize("version", ["one.two", "1.x", "1.", ".5", "1.2.3", "-1.0", "NaN", "1e3", 1.5, True,
                                     [1, 2], {"n": 1}, "9" * 40])
def test_a_min_parser_version_that_is_not_n_m_is_poison_with_an_envelope(admitter: Admitter,
                                                                         version: Any) -> None:
    verdict = admitter(json.dumps(blob_job(version)).encode(), admitter.meta("parse_blob"))
    assert isinstance(verdict, Settle) and verdict.disposition.action == "term", verdict
    assert verdict.envelope is not None and verdict.envelope.code == "bad_payload"
    assert "min_parser_version" in verdict.envelope.message


@pytest.mark.parametrize(("version", "action"), [("1.4", None), (2, "nak"), ("1.5", "nak"), ("99.0", "nak"),
                                                 ("1.0", None), (None, None)])
def test_a_real_parser_version_is_judged_once_and_a_newer_one_waits_without_failing(
        admitter: Admitter, version: Any, action: str | None) -> None:
    verdict = admitter(json.dumps(blob_job(version)).encode(), admitter.meta("parse_blob"))
    if action is None:
        assert isinstance(verdict, Dispatch)
    else:
        assert isinstance(verdict, Settle) and verdict.disposition.action == "nak"
        assert not verdict.disposition.counts_as_failure and verdict.envelope is None


@pytest.mark.parametrize("raw", [b"\xff\xfe{}", b'"a string"', b"[1, 2]", b"null", b"", b"{", b"NaN",
                                 json.dumps(fetch_job(ext_id=["1"])).encode(), b'{"job_id": NaN}'])
def test_other_poison_is_termed_with_an_envelope(admitter: Admitter, raw: bytes) -> None:
    verdict = admitter(raw, admitter.meta())
    assert isinstance(verdict, Settle) and verdict.disposition.action == "term"
    assert verdict.envelope is not None and verdict.envelope.code == "bad_payload"


def test_an_unknown_kind_is_poison_not_a_crash(admitter: Admitter) -> None:
    verdict = admitter(json.dumps(fetch_job()).encode(), admitter.meta("webhook_event"))
    assert isinstance(verdict, Settle) and verdict.envelope is not None
    assert verdict.envelope.code == "unsupported_job"


# --------------------------------------------------------------------------- history: ledger, lease, count
def test_a_first_delivery_reads_no_history(admitter: Admitter) -> None:
    """Nothing ran before a first delivery: admission does not even ask Redis (the hot path)."""
    verdict = admitter(json.dumps(fetch_job()).encode(), admitter.meta(delivered=1), url=UNREACHABLE_REDIS)
    assert isinstance(verdict, Dispatch)


def test_history_unavailable_is_a_nak_that_is_no_failure(admitter: Admitter) -> None:
    verdict = admitter(json.dumps(fetch_job()).encode(), admitter.meta(delivered=2), url=UNREACHABLE_REDIS)
    assert isinstance(verdict, Settle) and verdict.disposition.action == "nak"
    assert not verdict.disposition.counts_as_failure


@pytest.mark.parametrize("outcome", [ack(), term("not_found: gone"), nak(30.0, "rate_limited", failure=False)])
def test_a_recorded_outcome_is_applied_without_running_the_job(admitter: Admitter, outcome: Any) -> None:
    meta = admitter.meta(delivered=2)
    OutcomeLedger(admitter.sync).record(meta.key, outcome)
    verdict = admitter(b"[" * DEEP + b"]" * DEEP, meta)  # even a body admission could not read
    assert isinstance(verdict, Settle) and verdict.recorded
    assert verdict.disposition == outcome and verdict.envelope is None  # the envelope was published already


def test_a_running_lease_is_adopted_and_a_stale_grant_is_not(admitter: Admitter) -> None:
    meta = admitter.meta(delivered=2)
    token = new_token()
    admitter.leases.grant(meta.key.id, token, 30.0)
    assert isinstance(admitter(json.dumps(fetch_job()).encode(), meta), Dispatch)  # only granted: send again
    assert admitter.leases.take(meta.key.id, token, 30.0)
    assert isinstance(admitter(json.dumps(fetch_job()).encode(), meta), Adopt)


def test_the_stream_is_part_of_every_key(admitter: Admitter) -> None:
    """The same sequence on another stream (CAIRN_WEBHOOKS) has a history of its own."""
    jobs = admitter.meta(delivered=2)
    hooks = DeliveryMeta(kind=jobs.kind, stream="CAIRN_WEBHOOKS", seq=jobs.seq, stamp=jobs.stamp, delivered=2)
    OutcomeLedger(admitter.sync).record(hooks.key, ack())
    assert isinstance(admitter(json.dumps(fetch_job()).encode(), jobs), Dispatch)
    assert isinstance(admitter(json.dumps(fetch_job()).encode(), hooks), Settle)


def test_failed_deliveries_end_in_an_envelope_and_a_term(admitter: Admitter) -> None:
    meta = admitter.meta(delivered=7)
    admitter.sync.set(failures_key(meta.key), 3)
    assert isinstance(admitter(json.dumps(fetch_job()).encode(), meta), Dispatch)
    admitter.sync.set(failures_key(meta.key), 4)
    verdict = admitter(json.dumps(fetch_job()).encode(), meta)
    assert isinstance(verdict, Settle) and verdict.disposition.action == "term"
    assert verdict.envelope is not None and verdict.envelope.code == "max_deliveries"
    assert gives_up(4, 5) and not gives_up(3, 5)


def test_the_last_delivery_a_finite_max_deliver_allows_is_termed(admitter: Admitter) -> None:
    rules = Rules(term_after_deliveries=5, max_deliver=8)
    assert isinstance(admitter(json.dumps(fetch_job()).encode(), admitter.meta(delivered=7), rules), Dispatch)
    verdict = admitter(json.dumps(fetch_job()).encode(), admitter.meta(delivered=8), rules)
    assert isinstance(verdict, Settle) and verdict.envelope is not None
    assert verdict.envelope.code == "max_deliveries"


def test_message_keys_name_stream_sequence_and_timestamp() -> None:
    key = MessageKey(JOBS_STREAM, 42, 1_770_000_000.5)
    assert key.id == "CAIRN_JOBS:42:1770000000.500000"
    assert MessageKey.from_meta(key.as_meta()) == key


# --------------------------------------------------------------------------- fuzzing
_scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
            | st.text(max_size=30))
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
_versions = (st.sampled_from(["one.two", "1.x", "1.", ".5", "1.2.3", "-1.0", "١.٢", " 2 ", "1e3", "NaN", "0.0",
                              "1.4", "2", "999999999.9"]) | st.text(max_size=12) | _scalars)
_job_like = st.fixed_dictionaries(
    {"job_id": st.one_of(st.text(max_size=20), _scalars), "account_id": st.one_of(st.just("acct"), _scalars),
     "user_id": st.one_of(st.just("user"), _scalars), "ext_id": st.one_of(st.just("1"), _scalars)},
    optional={"min_parser_version": _versions, "blob": st.one_of(_json, st.just({"url": "https://x"})),
              "watermark": _json, "max_enqueue": _json, "known_ext_ids": _json, "since_unix": _json,
              "until_unix": _json, "page_size": _json})
_deep = st.integers(min_value=1, max_value=DEEP).flatmap(
    lambda n: st.sampled_from([b"[" * n + b"]" * n, b'{"a":' * n + b"0" + b"}" * n, b"[" * n]))
_huge = st.integers(min_value=10_000, max_value=2_000_000).map(
    lambda n: json.dumps(fetch_job(ext_id="9" * n, job_id="x" * n)).encode())
_bodies = st.one_of(
    st.binary(max_size=300),
    _json.map(lambda v: json.dumps(v).encode()),
    _job_like.map(lambda v: json.dumps(v).encode()),
    _deep, _huge,
    st.binary(min_size=1, max_size=50).map(lambda b: b'{"job_id": "' + b + b'"}'),  # invalid UTF-8 inside
)


@FUZZ
@given(raw=_bodies, kind=st.sampled_from([*JOB_KINDS, "webhook_event"]), delivered=st.integers(1, 12),
       max_deliver=st.sampled_from([-1, 6, 10]))
def test_every_input_ends_in_exactly_one_verdict(admitter: Admitter, raw: bytes, kind: str, delivered: int,
                                                 max_deliver: int) -> None:
    meta = admitter.meta(kind, delivered)
    verdict = admitter(raw, meta, Rules(5, max_deliver))
    assert_one_verdict(verdict, meta)
