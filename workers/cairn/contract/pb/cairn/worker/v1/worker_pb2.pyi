import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from workers.cairn.contract.pb.cairn.v1 import activity_pb2 as _activity_pb2
from workers.cairn.contract.pb.cairn.v1 import segment_pb2 as _segment_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CLASS_UNSPECIFIED: _ClassVar[ErrorClass]
    ERROR_CLASS_TRANSIENT: _ClassVar[ErrorClass]
    ERROR_CLASS_RATE_LIMITED: _ClassVar[ErrorClass]
    ERROR_CLASS_AUTH_EXPIRED: _ClassVar[ErrorClass]
    ERROR_CLASS_AUTH_INVALID: _ClassVar[ErrorClass]
    ERROR_CLASS_NOT_FOUND: _ClassVar[ErrorClass]
    ERROR_CLASS_INVALID_INPUT: _ClassVar[ErrorClass]
    ERROR_CLASS_PROVIDER_DOWN: _ClassVar[ErrorClass]
    ERROR_CLASS_WORKER_BUG: _ClassVar[ErrorClass]

class WorkerEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_EVENT_TYPE_UNSPECIFIED: _ClassVar[WorkerEventType]
    WORKER_EVENT_TYPE_ACTIVITY: _ClassVar[WorkerEventType]
    WORKER_EVENT_TYPE_SEGMENT: _ClassVar[WorkerEventType]
    WORKER_EVENT_TYPE_SEGMENT_EFFORT: _ClassVar[WorkerEventType]
    WORKER_EVENT_TYPE_RECORD: _ClassVar[WorkerEventType]
    WORKER_EVENT_TYPE_METRIC: _ClassVar[WorkerEventType]
    WORKER_EVENT_TYPE_GEAR: _ClassVar[WorkerEventType]
ERROR_CLASS_UNSPECIFIED: ErrorClass
ERROR_CLASS_TRANSIENT: ErrorClass
ERROR_CLASS_RATE_LIMITED: ErrorClass
ERROR_CLASS_AUTH_EXPIRED: ErrorClass
ERROR_CLASS_AUTH_INVALID: ErrorClass
ERROR_CLASS_NOT_FOUND: ErrorClass
ERROR_CLASS_INVALID_INPUT: ErrorClass
ERROR_CLASS_PROVIDER_DOWN: ErrorClass
ERROR_CLASS_WORKER_BUG: ErrorClass
WORKER_EVENT_TYPE_UNSPECIFIED: WorkerEventType
WORKER_EVENT_TYPE_ACTIVITY: WorkerEventType
WORKER_EVENT_TYPE_SEGMENT: WorkerEventType
WORKER_EVENT_TYPE_SEGMENT_EFFORT: WorkerEventType
WORKER_EVENT_TYPE_RECORD: WorkerEventType
WORKER_EVENT_TYPE_METRIC: WorkerEventType
WORKER_EVENT_TYPE_GEAR: WorkerEventType

class PayloadRef(_message.Message):
    __slots__ = ("blob_id", "size_bytes", "content_type", "content_sha256")
    BLOB_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_SHA256_FIELD_NUMBER: _ClassVar[int]
    blob_id: str
    size_bytes: int
    content_type: str
    content_sha256: str
    def __init__(self, blob_id: _Optional[str] = ..., size_bytes: _Optional[int] = ..., content_type: _Optional[str] = ..., content_sha256: _Optional[str] = ...) -> None: ...

class WorkerError(_message.Message):
    __slots__ = ("code", "message", "retry_after", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CLASS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    retry_after: _timestamp_pb2.Timestamp
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., retry_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., **kwargs) -> None: ...

class ExternalRef(_message.Message):
    __slots__ = ("user_id", "provider", "external_account_id", "external_id")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_ACCOUNT_ID_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    provider: str
    external_account_id: str
    external_id: str
    def __init__(self, user_id: _Optional[str] = ..., provider: _Optional[str] = ..., external_account_id: _Optional[str] = ..., external_id: _Optional[str] = ...) -> None: ...

class Attachment(_message.Message):
    __slots__ = ("blob_id", "external_url", "content_type", "caption", "width", "height")
    BLOB_ID_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_URL_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    CAPTION_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    blob_id: str
    external_url: str
    content_type: str
    caption: str
    width: int
    height: int
    def __init__(self, blob_id: _Optional[str] = ..., external_url: _Optional[str] = ..., content_type: _Optional[str] = ..., caption: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class ImportedActivity(_message.Message):
    __slots__ = ("ref", "raw_blob_id", "payload", "stream", "attachments", "raw_content_type", "raw_size_bytes")
    REF_FIELD_NUMBER: _ClassVar[int]
    RAW_BLOB_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ATTACHMENTS_FIELD_NUMBER: _ClassVar[int]
    RAW_CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    RAW_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ref: ExternalRef
    raw_blob_id: str
    payload: _activity_pb2.ActivitySourcePayload
    stream: _activity_pb2.ActivityStream
    attachments: _containers.RepeatedCompositeFieldContainer[Attachment]
    raw_content_type: str
    raw_size_bytes: int
    def __init__(self, ref: _Optional[_Union[ExternalRef, _Mapping]] = ..., raw_blob_id: _Optional[str] = ..., payload: _Optional[_Union[_activity_pb2.ActivitySourcePayload, _Mapping]] = ..., stream: _Optional[_Union[_activity_pb2.ActivityStream, _Mapping]] = ..., attachments: _Optional[_Iterable[_Union[Attachment, _Mapping]]] = ..., raw_content_type: _Optional[str] = ..., raw_size_bytes: _Optional[int] = ...) -> None: ...

class SegmentImport(_message.Message):
    __slots__ = ("name", "description", "activity_type", "encoded_polyline", "distance_m", "elevation_gain_m", "elevation_loss_m", "avg_grade", "max_grade", "climb_category", "bidirectional", "starred")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    ENCODED_POLYLINE_FIELD_NUMBER: _ClassVar[int]
    DISTANCE_M_FIELD_NUMBER: _ClassVar[int]
    ELEVATION_GAIN_M_FIELD_NUMBER: _ClassVar[int]
    ELEVATION_LOSS_M_FIELD_NUMBER: _ClassVar[int]
    AVG_GRADE_FIELD_NUMBER: _ClassVar[int]
    MAX_GRADE_FIELD_NUMBER: _ClassVar[int]
    CLIMB_CATEGORY_FIELD_NUMBER: _ClassVar[int]
    BIDIRECTIONAL_FIELD_NUMBER: _ClassVar[int]
    STARRED_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    activity_type: _activity_pb2.ActivityType
    encoded_polyline: str
    distance_m: float
    elevation_gain_m: float
    elevation_loss_m: float
    avg_grade: float
    max_grade: float
    climb_category: _segment_pb2.ClimbCategory
    bidirectional: bool
    starred: bool
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., activity_type: _Optional[_Union[_activity_pb2.ActivityType, str]] = ..., encoded_polyline: _Optional[str] = ..., distance_m: _Optional[float] = ..., elevation_gain_m: _Optional[float] = ..., elevation_loss_m: _Optional[float] = ..., avg_grade: _Optional[float] = ..., max_grade: _Optional[float] = ..., climb_category: _Optional[_Union[_segment_pb2.ClimbCategory, str]] = ..., bidirectional: _Optional[bool] = ..., starred: _Optional[bool] = ...) -> None: ...

class ImportedSegment(_message.Message):
    __slots__ = ("ref", "payload")
    REF_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ref: ExternalRef
    payload: SegmentImport
    def __init__(self, ref: _Optional[_Union[ExternalRef, _Mapping]] = ..., payload: _Optional[_Union[SegmentImport, _Mapping]] = ...) -> None: ...

class SegmentEffortImport(_message.Message):
    __slots__ = ("start_time", "elapsed", "moving", "start_offset", "end_offset", "avg_heart_rate_bpm", "max_heart_rate_bpm", "avg_power_w", "avg_cadence", "avg_speed_mps")
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_FIELD_NUMBER: _ClassVar[int]
    MOVING_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    AVG_HEART_RATE_BPM_FIELD_NUMBER: _ClassVar[int]
    MAX_HEART_RATE_BPM_FIELD_NUMBER: _ClassVar[int]
    AVG_POWER_W_FIELD_NUMBER: _ClassVar[int]
    AVG_CADENCE_FIELD_NUMBER: _ClassVar[int]
    AVG_SPEED_MPS_FIELD_NUMBER: _ClassVar[int]
    start_time: _timestamp_pb2.Timestamp
    elapsed: _duration_pb2.Duration
    moving: _duration_pb2.Duration
    start_offset: int
    end_offset: int
    avg_heart_rate_bpm: int
    max_heart_rate_bpm: int
    avg_power_w: int
    avg_cadence: int
    avg_speed_mps: float
    def __init__(self, start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., elapsed: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., moving: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., avg_heart_rate_bpm: _Optional[int] = ..., max_heart_rate_bpm: _Optional[int] = ..., avg_power_w: _Optional[int] = ..., avg_cadence: _Optional[int] = ..., avg_speed_mps: _Optional[float] = ...) -> None: ...

class ImportedSegmentEffort(_message.Message):
    __slots__ = ("ref", "activity_external_id", "segment_external_id", "payload")
    REF_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ref: ExternalRef
    activity_external_id: str
    segment_external_id: str
    payload: SegmentEffortImport
    def __init__(self, ref: _Optional[_Union[ExternalRef, _Mapping]] = ..., activity_external_id: _Optional[str] = ..., segment_external_id: _Optional[str] = ..., payload: _Optional[_Union[SegmentEffortImport, _Mapping]] = ...) -> None: ...

class RecordImport(_message.Message):
    __slots__ = ("metric", "duration", "distance_m", "value", "start_offset")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    DISTANCE_M_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    metric: _segment_pb2.BestEffortMetric
    duration: _duration_pb2.Duration
    distance_m: float
    value: float
    start_offset: int
    def __init__(self, metric: _Optional[_Union[_segment_pb2.BestEffortMetric, str]] = ..., duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., distance_m: _Optional[float] = ..., value: _Optional[float] = ..., start_offset: _Optional[int] = ...) -> None: ...

class ImportedRecord(_message.Message):
    __slots__ = ("ref", "activity_external_id", "payload")
    REF_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ref: ExternalRef
    activity_external_id: str
    payload: RecordImport
    def __init__(self, ref: _Optional[_Union[ExternalRef, _Mapping]] = ..., activity_external_id: _Optional[str] = ..., payload: _Optional[_Union[RecordImport, _Mapping]] = ...) -> None: ...

class ImportedMetric(_message.Message):
    __slots__ = ("ref", "key", "ts", "value_numeric", "value_json")
    REF_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    VALUE_NUMERIC_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    ref: ExternalRef
    key: str
    ts: _timestamp_pb2.Timestamp
    value_numeric: float
    value_json: str
    def __init__(self, ref: _Optional[_Union[ExternalRef, _Mapping]] = ..., key: _Optional[str] = ..., ts: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., value_numeric: _Optional[float] = ..., value_json: _Optional[str] = ...) -> None: ...

class GearImport(_message.Message):
    __slots__ = ("name", "brand", "model", "kind", "description", "distance_m", "retired", "primary")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BRAND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    DISTANCE_M_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    name: str
    brand: str
    model: str
    kind: str
    description: str
    distance_m: float
    retired: bool
    primary: bool
    def __init__(self, name: _Optional[str] = ..., brand: _Optional[str] = ..., model: _Optional[str] = ..., kind: _Optional[str] = ..., description: _Optional[str] = ..., distance_m: _Optional[float] = ..., retired: _Optional[bool] = ..., primary: _Optional[bool] = ...) -> None: ...

class ImportedGear(_message.Message):
    __slots__ = ("ref", "payload")
    REF_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ref: ExternalRef
    payload: GearImport
    def __init__(self, ref: _Optional[_Union[ExternalRef, _Mapping]] = ..., payload: _Optional[_Union[GearImport, _Mapping]] = ...) -> None: ...

class WorkerEvent(_message.Message):
    __slots__ = ("type", "activity", "segment", "segment_effort", "record", "metric", "gear")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_EFFORT_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    GEAR_FIELD_NUMBER: _ClassVar[int]
    type: WorkerEventType
    activity: ImportedActivity
    segment: ImportedSegment
    segment_effort: ImportedSegmentEffort
    record: ImportedRecord
    metric: ImportedMetric
    gear: ImportedGear
    def __init__(self, type: _Optional[_Union[WorkerEventType, str]] = ..., activity: _Optional[_Union[ImportedActivity, _Mapping]] = ..., segment: _Optional[_Union[ImportedSegment, _Mapping]] = ..., segment_effort: _Optional[_Union[ImportedSegmentEffort, _Mapping]] = ..., record: _Optional[_Union[ImportedRecord, _Mapping]] = ..., metric: _Optional[_Union[ImportedMetric, _Mapping]] = ..., gear: _Optional[_Union[ImportedGear, _Mapping]] = ...) -> None: ...

class RateLimitSnapshot(_message.Message):
    __slots__ = ("short_remaining", "short_limit", "short_reset_at", "long_remaining", "long_limit", "long_reset_at")
    SHORT_REMAINING_FIELD_NUMBER: _ClassVar[int]
    SHORT_LIMIT_FIELD_NUMBER: _ClassVar[int]
    SHORT_RESET_AT_FIELD_NUMBER: _ClassVar[int]
    LONG_REMAINING_FIELD_NUMBER: _ClassVar[int]
    LONG_LIMIT_FIELD_NUMBER: _ClassVar[int]
    LONG_RESET_AT_FIELD_NUMBER: _ClassVar[int]
    short_remaining: int
    short_limit: int
    short_reset_at: _timestamp_pb2.Timestamp
    long_remaining: int
    long_limit: int
    long_reset_at: _timestamp_pb2.Timestamp
    def __init__(self, short_remaining: _Optional[int] = ..., short_limit: _Optional[int] = ..., short_reset_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., long_remaining: _Optional[int] = ..., long_limit: _Optional[int] = ..., long_reset_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class JobResult(_message.Message):
    __slots__ = ("events", "new_watermark", "more_available", "worker_name", "worker_version", "worker_package", "payload_ref", "error", "failed_ref")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEW_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    MORE_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    WORKER_NAME_FIELD_NUMBER: _ClassVar[int]
    WORKER_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_PACKAGE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_REF_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FAILED_REF_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[WorkerEvent]
    new_watermark: _timestamp_pb2.Timestamp
    more_available: bool
    worker_name: str
    worker_version: str
    worker_package: str
    payload_ref: PayloadRef
    error: WorkerError
    failed_ref: ExternalRef
    def __init__(self, events: _Optional[_Iterable[_Union[WorkerEvent, _Mapping]]] = ..., new_watermark: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., more_available: _Optional[bool] = ..., worker_name: _Optional[str] = ..., worker_version: _Optional[str] = ..., worker_package: _Optional[str] = ..., payload_ref: _Optional[_Union[PayloadRef, _Mapping]] = ..., error: _Optional[_Union[WorkerError, _Mapping]] = ..., failed_ref: _Optional[_Union[ExternalRef, _Mapping]] = ...) -> None: ...
