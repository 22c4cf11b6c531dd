"""Every record-header form the FIT protocol defines imports; a file that cannot be read says why.

The files are written by fit-tool (tests/kit/fit_forms.py), not by the decoder's
authors: normal headers, compressed-timestamp headers (no timestamp field, a 5-bit
offset in the header), developer fields, several sessions, and all of them at
once. Each must import with the right start, distance, durations, laps and
samples. A broken header, size or CRC is ``corrupt_fit``; intact records that break
the protocol are ``malformed_fit``; a protocol version the decoder does not know is
``unsupported_fit_feature`` naming it; a file with no session is ``not_an_activity``.
"""

from __future__ import annotations

import struct
from datetime import datetime, timedelta
from typing import Any

import pytest
from fit_tool.fit_file_builder import FitFileBuilder
from fit_tool.profile.messages.file_id_message import FileIdMessage
from fit_tool.profile.profile_type import FileType, Manufacturer, Sport
from fit_tool.utils.crc import crc16

from tests.kit import fit_forms
from tests.kit.fit_forms import LEG_S, SPEED_MPS, START, STEP_S, activity, with_protocol_version
from workers.providers.errors import ProviderPermanentError
from workers.providers.garmin.dataset import build_archive, parse_dataset
from workers.providers.protos import worker_events

MULTISPORT = (Sport.RUNNING, Sport.CYCLING)
FORMS: dict[str, dict[str, Any]] = {
    "normal": {},
    "compressed-timestamp": {"compressed": True},
    "developer-fields": {"developer": True},
    "several-sessions": {"sports": MULTISPORT},
    "all-at-once": {"compressed": True, "developer": True, "sports": MULTISPORT},
}


def _import(fit: bytes) -> dict[str, Any]:
    events = parse_dataset(build_archive("777", {}, [], fit), user_id="u-1", account_id="a-1").events
    worker_events(events)  # strictly parsed: a field outside the contract fails here
    return events[-1]["activity"]


@pytest.mark.parametrize("form", FORMS)
def test_each_record_header_form_imports_with_its_start_distance_durations_laps_and_samples(form: str) -> None:
    options = FORMS[form]
    sports = options.get("sports", (Sport.RUNNING,))
    imported = _import(activity(**options))
    payload, stream = imported["payload"], imported["stream"]
    assert payload["startTime"] == _z(START)
    assert payload["summary"]["distanceM"] == pytest.approx(sum(SPEED_MPS[s] * LEG_S for s in sports))
    assert payload["endTime"] == _z(START + timedelta(seconds=LEG_S * len(sports)))
    assert payload["elapsedDuration"] == f"{LEG_S * len(sports)}s"
    assert payload["movingDuration"] == f"{(LEG_S - 10) * len(sports)}s"
    laps = payload["laps"]
    assert len(laps) == 2 * len(sports)
    assert [lap["startTime"] for lap in laps] == [_z(START + timedelta(seconds=n * LEG_S / 2))
                                                  for n in range(len(laps))]
    assert {lap["elapsedDuration"] for lap in laps} == {f"{LEG_S // 2}s"}
    samples = LEG_S * len(sports) // STEP_S + 1
    assert stream["sampleCount"] == samples
    assert stream["timeS"] == [float(STEP_S * n) for n in range(samples)]  # the compressed offsets resolved
    assert stream["heartRateBpm"][:3] == [120, 125, 130]
    assert stream["distanceM"][-1] == pytest.approx(payload["summary"]["distanceM"])


def _z(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def _restamp_crc(body: bytes) -> bytes:
    return body + struct.pack("<H", crc16(body))


@pytest.mark.parametrize(("damage", "code", "words"), [
    ("truncated", "corrupt_fit", "truncated"),
    ("crc", "corrupt_fit", "CRC"),
    ("header", "corrupt_fit", "header"),
    ("undefined-local-message", "malformed_fit", "local message 5 not defined"),
    ("protocol-3", "unsupported_fit_feature", "FIT protocol version 3.0"),
    ("no-session", "not_an_activity", "no session"),
])
def test_a_fit_that_cannot_be_imported_names_its_true_cause(damage: str, code: str, words: str) -> None:
    fit = activity()
    header_size = fit[0]
    bad = {
        "truncated": fit[: len(fit) // 2],
        "crc": fit[:-1] + bytes([fit[-1] ^ 0xFF]),
        "header": fit[:8] + b".FOO" + fit[12:],
        # a data record (local type 5) that no definition precedes; the CRC is intact
        "undefined-local-message": _restamp_crc(fit[:4] + struct.pack("<I", 1) + fit[8:header_size] + b"\x05"),
        "protocol-3": with_protocol_version(fit, 3),
        "no-session": None,
    }[damage]
    if bad is None:
        bad = _file_id_only()
    with pytest.raises(ProviderPermanentError) as err:
        _import(bad)
    assert err.value.code == code and words in str(err.value), (err.value.code, str(err.value))


def _file_id_only() -> bytes:
    """A FIT file holding only its file_id: readable, but no activity."""
    builder = FitFileBuilder(auto_define=True)
    file_id = FileIdMessage()
    file_id.type, file_id.manufacturer, file_id.product = FileType.ACTIVITY, Manufacturer.GARMIN.value, 3113
    builder.add(file_id)
    return builder.build().to_bytes()


def test_the_kit_writes_compressed_headers_without_a_timestamp_field() -> None:
    """The compressed form really is one: record headers with bit 7 set and local type 3."""
    fit = activity(compressed=True)
    expected = 0x80 | fit_forms.RECORD_LOCAL_ID << 5
    assert sum(1 for b in fit if b & 0xE0 == expected) >= LEG_S // STEP_S
