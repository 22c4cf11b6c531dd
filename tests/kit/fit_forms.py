"""FIT activity files in each record-header form the protocol defines, written with fit-tool (not a decoder)."""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta

from fit_tool.base_type import BaseType
from fit_tool.developer_field import DeveloperField
from fit_tool.fit_file_builder import FitFileBuilder
from fit_tool.profile.messages.activity_message import ActivityMessage
from fit_tool.profile.messages.developer_data_id_message import DeveloperDataIdMessage
from fit_tool.profile.messages.event_message import EventMessage
from fit_tool.profile.messages.field_description_message import FieldDescriptionMessage
from fit_tool.profile.messages.file_id_message import FileIdMessage
from fit_tool.profile.messages.lap_message import LapMessage
from fit_tool.profile.messages.record_message import RecordMessage
from fit_tool.profile.messages.session_message import SessionMessage
from fit_tool.profile.profile_type import Event, EventType, FileType, Manufacturer, Sport, SubSport
from fit_tool.record import RecordHeader
from fit_tool.utils.crc import crc16

START = datetime(2026, 6, 14, 5, 30, 0, tzinfo=UTC)
FIT_EPOCH_UNIX = 631065600
STEP_S = 5  # one record every STEP_S seconds: below the 32 s a compressed offset can span
LEG_S = 300  # each session (a multisport leg) lasts this long, in two laps
SPEED_MPS = {Sport.RUNNING: 3.0, Sport.CYCLING: 8.0}
RECORD_LOCAL_ID = 3  # a compressed-timestamp header addresses local types 0..3 only
TIME_OFFSET_MASK = 0x1F  # the header's 5-bit time offset (FIT protocol, compressed timestamp header)
DEV_FIELD_NAME = "doughnuts_earned"
PROTOCOL_VERSION_OFFSET = 1  # the header byte holding the protocol version (major << 4 | minor)
HEADER_WITH_CRC = 14  # a header this long ends with its own CRC


def _ms(offset_s: float) -> int:
    return int((START + timedelta(seconds=offset_s)).timestamp() * 1000)


def _fit_seconds(offset_s: float) -> int:
    return int(START.timestamp() + offset_s) - FIT_EPOCH_UNIX


def activity(*, compressed: bool = False, developer: bool = False,
             sports: tuple[Sport, ...] = (Sport.RUNNING,)) -> bytes:
    """An activity of one session per sport (several: multisport), each of two laps and a record every STEP_S.

    ``compressed``: every record carries a compressed-timestamp header (``0x80 | local_type << 5 |
    time_offset``) and no timestamp field, as older and some third-party devices write them.
    ``developer``: every record carries a developer field (a Connect IQ app's), declared up front.
    """
    builder = FitFileBuilder(auto_define=True, min_string_size=50)
    file_id = FileIdMessage()
    file_id.type, file_id.manufacturer, file_id.product = FileType.ACTIVITY, Manufacturer.GARMIN.value, 3113
    file_id.time_created, file_id.serial_number = _ms(0), 1234
    builder.add(file_id)
    if developer:
        dev_id = DeveloperDataIdMessage()
        dev_id.application_id, dev_id.developer_data_index = b"0123456789abcdef", 0
        builder.add(dev_id)
        description = FieldDescriptionMessage()
        description.developer_data_index, description.field_definition_number = 0, 0
        description.fit_base_type_id, description.field_name, description.units = BaseType.UINT8, DEV_FIELD_NAME, "n"
        builder.add(description)
    start = EventMessage()
    start.timestamp, start.event, start.event_type = _ms(0), Event.TIMER, EventType.START
    builder.add(start)  # the timestamp a first compressed record counts from
    sessions = []
    for leg, sport in enumerate(sports):
        begin, speed = leg * LEG_S, SPEED_MPS[sport]
        for t in range(0 if leg == 0 else STEP_S, LEG_S + 1, STEP_S):
            _add_record(builder, begin + t, begin * SPEED_MPS[sports[0]] + speed * t, compressed, developer)
        for n in (0, 1):
            lap = LapMessage()
            lap.start_time, lap.timestamp = _ms(begin + n * LEG_S / 2), _ms(begin + (n + 1) * LEG_S / 2)
            lap.total_elapsed_time = lap.total_timer_time = LEG_S / 2
            lap.total_distance = speed * LEG_S / 2
            builder.add(lap)
        session = SessionMessage()
        session.start_time, session.timestamp = _ms(begin), _ms(begin + LEG_S)
        session.sport, session.sub_sport = sport, SubSport.GENERIC
        session.total_elapsed_time, session.total_timer_time = float(LEG_S), float(LEG_S - 10)
        session.total_distance = speed * LEG_S
        sessions.append(session)
    builder.add_all(sessions)
    act = ActivityMessage()
    act.timestamp, act.num_sessions = _ms(LEG_S * len(sports)), len(sports)
    act.local_timestamp = _fit_seconds(LEG_S * len(sports)) + 7200
    builder.add(act)
    return builder.build().to_bytes()


def _add_record(builder: FitFileBuilder, t: float, distance: float, compressed: bool, developer: bool) -> None:
    fields = []
    if developer:
        field = DeveloperField(developer_data_index=0, field_id=0, size=1)
        field.set_value(0, int(t) % 200)
        fields = [field]
    record = RecordMessage(local_id=RECORD_LOCAL_ID, developer_fields=fields)
    record.distance, record.heart_rate, record.speed = distance, 120 + int(t) % 40, 3.0
    if not compressed:
        record.timestamp = _ms(t)
    builder.add(record)
    if compressed:  # fit-tool writes the header form; its definition (no timestamp field) stays as built
        builder.records[-1].header = RecordHeader(is_time_compressed=True, is_definition=False,
                                                  local_id=RECORD_LOCAL_ID,
                                                  time_offset_seconds=_fit_seconds(t) & TIME_OFFSET_MASK)


def with_protocol_version(fit: bytes, major: int, minor: int = 0) -> bytes:
    """``fit`` re-stamped with another protocol version; its CRCs recomputed, so the file stays intact."""
    body = bytearray(fit[:-2])
    body[PROTOCOL_VERSION_OFFSET] = major << 4 | minor
    header_size = body[0]  # 12, or 14 with the header's own CRC
    if header_size >= HEADER_WITH_CRC:
        body[header_size - 2:header_size] = struct.pack("<H", crc16(bytes(body[:header_size - 2])))
    return bytes(body) + struct.pack("<H", crc16(bytes(body)))
