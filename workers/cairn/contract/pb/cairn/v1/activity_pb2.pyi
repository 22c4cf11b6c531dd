import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from workers.cairn.contract.pb.cairn.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ActivityType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTIVITY_TYPE_UNSPECIFIED: _ClassVar[ActivityType]
    ACTIVITY_TYPE_RIDE: _ClassVar[ActivityType]
    ACTIVITY_TYPE_RUN: _ClassVar[ActivityType]
    ACTIVITY_TYPE_SWIM: _ClassVar[ActivityType]
    ACTIVITY_TYPE_HIKE: _ClassVar[ActivityType]
    ACTIVITY_TYPE_WALK: _ClassVar[ActivityType]
    ACTIVITY_TYPE_ROW: _ClassVar[ActivityType]
    ACTIVITY_TYPE_SKI: _ClassVar[ActivityType]
    ACTIVITY_TYPE_WORKOUT: _ClassVar[ActivityType]
    ACTIVITY_TYPE_SNOWBOARD: _ClassVar[ActivityType]
    ACTIVITY_TYPE_SKATE: _ClassVar[ActivityType]
    ACTIVITY_TYPE_KAYAK: _ClassVar[ActivityType]
    ACTIVITY_TYPE_SUP: _ClassVar[ActivityType]
    ACTIVITY_TYPE_SURF: _ClassVar[ActivityType]
    ACTIVITY_TYPE_GOLF: _ClassVar[ActivityType]
    ACTIVITY_TYPE_CLIMB: _ClassVar[ActivityType]
    ACTIVITY_TYPE_TENNIS: _ClassVar[ActivityType]
    ACTIVITY_TYPE_ELLIPTICAL: _ClassVar[ActivityType]
    ACTIVITY_TYPE_WHEELCHAIR: _ClassVar[ActivityType]

class Discipline(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DISCIPLINE_UNSPECIFIED: _ClassVar[Discipline]
    DISCIPLINE_RIDE_ROAD: _ClassVar[Discipline]
    DISCIPLINE_RIDE_MTB: _ClassVar[Discipline]
    DISCIPLINE_RIDE_GRAVEL: _ClassVar[Discipline]
    DISCIPLINE_RIDE_CYCLOCROSS: _ClassVar[Discipline]
    DISCIPLINE_RIDE_TRACK: _ClassVar[Discipline]
    DISCIPLINE_RIDE_BMX: _ClassVar[Discipline]
    DISCIPLINE_RUN_ROAD: _ClassVar[Discipline]
    DISCIPLINE_RUN_TRAIL: _ClassVar[Discipline]
    DISCIPLINE_RUN_TRACK: _ClassVar[Discipline]
    DISCIPLINE_SWIM_POOL: _ClassVar[Discipline]
    DISCIPLINE_SWIM_OPEN_WATER: _ClassVar[Discipline]
    DISCIPLINE_SKI_ALPINE: _ClassVar[Discipline]
    DISCIPLINE_SKI_NORDIC: _ClassVar[Discipline]
    DISCIPLINE_SKI_TOURING: _ClassVar[Discipline]
    DISCIPLINE_SKI_BACKCOUNTRY: _ClassVar[Discipline]

class StreamChannel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STREAM_CHANNEL_UNSPECIFIED: _ClassVar[StreamChannel]
    STREAM_CHANNEL_TIME: _ClassVar[StreamChannel]
    STREAM_CHANNEL_LATITUDE: _ClassVar[StreamChannel]
    STREAM_CHANNEL_LONGITUDE: _ClassVar[StreamChannel]
    STREAM_CHANNEL_ALTITUDE: _ClassVar[StreamChannel]
    STREAM_CHANNEL_DISTANCE: _ClassVar[StreamChannel]
    STREAM_CHANNEL_SPEED: _ClassVar[StreamChannel]
    STREAM_CHANNEL_HEART_RATE: _ClassVar[StreamChannel]
    STREAM_CHANNEL_POWER: _ClassVar[StreamChannel]
    STREAM_CHANNEL_CADENCE: _ClassVar[StreamChannel]
    STREAM_CHANNEL_TEMPERATURE: _ClassVar[StreamChannel]
    STREAM_CHANNEL_GRADE: _ClassVar[StreamChannel]
    STREAM_CHANNEL_LEFT_RIGHT_BALANCE: _ClassVar[StreamChannel]
    STREAM_CHANNEL_LEFT_TORQUE_EFFECTIVENESS: _ClassVar[StreamChannel]
    STREAM_CHANNEL_RIGHT_TORQUE_EFFECTIVENESS: _ClassVar[StreamChannel]
    STREAM_CHANNEL_LEFT_PEDAL_SMOOTHNESS: _ClassVar[StreamChannel]
    STREAM_CHANNEL_RIGHT_PEDAL_SMOOTHNESS: _ClassVar[StreamChannel]
    STREAM_CHANNEL_VERTICAL_OSCILLATION: _ClassVar[StreamChannel]
    STREAM_CHANNEL_GROUND_CONTACT_TIME: _ClassVar[StreamChannel]
    STREAM_CHANNEL_STRIDE_LENGTH: _ClassVar[StreamChannel]
    STREAM_CHANNEL_RESPIRATION_RATE: _ClassVar[StreamChannel]
    STREAM_CHANNEL_CORE_TEMPERATURE: _ClassVar[StreamChannel]
ACTIVITY_TYPE_UNSPECIFIED: ActivityType
ACTIVITY_TYPE_RIDE: ActivityType
ACTIVITY_TYPE_RUN: ActivityType
ACTIVITY_TYPE_SWIM: ActivityType
ACTIVITY_TYPE_HIKE: ActivityType
ACTIVITY_TYPE_WALK: ActivityType
ACTIVITY_TYPE_ROW: ActivityType
ACTIVITY_TYPE_SKI: ActivityType
ACTIVITY_TYPE_WORKOUT: ActivityType
ACTIVITY_TYPE_SNOWBOARD: ActivityType
ACTIVITY_TYPE_SKATE: ActivityType
ACTIVITY_TYPE_KAYAK: ActivityType
ACTIVITY_TYPE_SUP: ActivityType
ACTIVITY_TYPE_SURF: ActivityType
ACTIVITY_TYPE_GOLF: ActivityType
ACTIVITY_TYPE_CLIMB: ActivityType
ACTIVITY_TYPE_TENNIS: ActivityType
ACTIVITY_TYPE_ELLIPTICAL: ActivityType
ACTIVITY_TYPE_WHEELCHAIR: ActivityType
DISCIPLINE_UNSPECIFIED: Discipline
DISCIPLINE_RIDE_ROAD: Discipline
DISCIPLINE_RIDE_MTB: Discipline
DISCIPLINE_RIDE_GRAVEL: Discipline
DISCIPLINE_RIDE_CYCLOCROSS: Discipline
DISCIPLINE_RIDE_TRACK: Discipline
DISCIPLINE_RIDE_BMX: Discipline
DISCIPLINE_RUN_ROAD: Discipline
DISCIPLINE_RUN_TRAIL: Discipline
DISCIPLINE_RUN_TRACK: Discipline
DISCIPLINE_SWIM_POOL: Discipline
DISCIPLINE_SWIM_OPEN_WATER: Discipline
DISCIPLINE_SKI_ALPINE: Discipline
DISCIPLINE_SKI_NORDIC: Discipline
DISCIPLINE_SKI_TOURING: Discipline
DISCIPLINE_SKI_BACKCOUNTRY: Discipline
STREAM_CHANNEL_UNSPECIFIED: StreamChannel
STREAM_CHANNEL_TIME: StreamChannel
STREAM_CHANNEL_LATITUDE: StreamChannel
STREAM_CHANNEL_LONGITUDE: StreamChannel
STREAM_CHANNEL_ALTITUDE: StreamChannel
STREAM_CHANNEL_DISTANCE: StreamChannel
STREAM_CHANNEL_SPEED: StreamChannel
STREAM_CHANNEL_HEART_RATE: StreamChannel
STREAM_CHANNEL_POWER: StreamChannel
STREAM_CHANNEL_CADENCE: StreamChannel
STREAM_CHANNEL_TEMPERATURE: StreamChannel
STREAM_CHANNEL_GRADE: StreamChannel
STREAM_CHANNEL_LEFT_RIGHT_BALANCE: StreamChannel
STREAM_CHANNEL_LEFT_TORQUE_EFFECTIVENESS: StreamChannel
STREAM_CHANNEL_RIGHT_TORQUE_EFFECTIVENESS: StreamChannel
STREAM_CHANNEL_LEFT_PEDAL_SMOOTHNESS: StreamChannel
STREAM_CHANNEL_RIGHT_PEDAL_SMOOTHNESS: StreamChannel
STREAM_CHANNEL_VERTICAL_OSCILLATION: StreamChannel
STREAM_CHANNEL_GROUND_CONTACT_TIME: StreamChannel
STREAM_CHANNEL_STRIDE_LENGTH: StreamChannel
STREAM_CHANNEL_RESPIRATION_RATE: StreamChannel
STREAM_CHANNEL_CORE_TEMPERATURE: StreamChannel

class ActivitySummary(_message.Message):
    __slots__ = ("distance_m", "elevation_gain_m", "elevation_loss_m", "min_elevation_m", "max_elevation_m", "avg_speed_mps", "max_speed_mps", "avg_heart_rate_bpm", "max_heart_rate_bpm", "avg_power_w", "max_power_w", "normalized_power_w", "avg_cadence", "max_cadence", "avg_temperature_c", "min_temperature_c", "max_temperature_c", "calories_kcal", "tss", "intensity_factor", "pool_length_m", "total_strokes")
    DISTANCE_M_FIELD_NUMBER: _ClassVar[int]
    ELEVATION_GAIN_M_FIELD_NUMBER: _ClassVar[int]
    ELEVATION_LOSS_M_FIELD_NUMBER: _ClassVar[int]
    MIN_ELEVATION_M_FIELD_NUMBER: _ClassVar[int]
    MAX_ELEVATION_M_FIELD_NUMBER: _ClassVar[int]
    AVG_SPEED_MPS_FIELD_NUMBER: _ClassVar[int]
    MAX_SPEED_MPS_FIELD_NUMBER: _ClassVar[int]
    AVG_HEART_RATE_BPM_FIELD_NUMBER: _ClassVar[int]
    MAX_HEART_RATE_BPM_FIELD_NUMBER: _ClassVar[int]
    AVG_POWER_W_FIELD_NUMBER: _ClassVar[int]
    MAX_POWER_W_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_POWER_W_FIELD_NUMBER: _ClassVar[int]
    AVG_CADENCE_FIELD_NUMBER: _ClassVar[int]
    MAX_CADENCE_FIELD_NUMBER: _ClassVar[int]
    AVG_TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    MIN_TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    MAX_TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    CALORIES_KCAL_FIELD_NUMBER: _ClassVar[int]
    TSS_FIELD_NUMBER: _ClassVar[int]
    INTENSITY_FACTOR_FIELD_NUMBER: _ClassVar[int]
    POOL_LENGTH_M_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STROKES_FIELD_NUMBER: _ClassVar[int]
    distance_m: float
    elevation_gain_m: float
    elevation_loss_m: float
    min_elevation_m: float
    max_elevation_m: float
    avg_speed_mps: float
    max_speed_mps: float
    avg_heart_rate_bpm: int
    max_heart_rate_bpm: int
    avg_power_w: int
    max_power_w: int
    normalized_power_w: int
    avg_cadence: int
    max_cadence: int
    avg_temperature_c: float
    min_temperature_c: float
    max_temperature_c: float
    calories_kcal: int
    tss: float
    intensity_factor: float
    pool_length_m: int
    total_strokes: int
    def __init__(self, distance_m: _Optional[float] = ..., elevation_gain_m: _Optional[float] = ..., elevation_loss_m: _Optional[float] = ..., min_elevation_m: _Optional[float] = ..., max_elevation_m: _Optional[float] = ..., avg_speed_mps: _Optional[float] = ..., max_speed_mps: _Optional[float] = ..., avg_heart_rate_bpm: _Optional[int] = ..., max_heart_rate_bpm: _Optional[int] = ..., avg_power_w: _Optional[int] = ..., max_power_w: _Optional[int] = ..., normalized_power_w: _Optional[int] = ..., avg_cadence: _Optional[int] = ..., max_cadence: _Optional[int] = ..., avg_temperature_c: _Optional[float] = ..., min_temperature_c: _Optional[float] = ..., max_temperature_c: _Optional[float] = ..., calories_kcal: _Optional[int] = ..., tss: _Optional[float] = ..., intensity_factor: _Optional[float] = ..., pool_length_m: _Optional[int] = ..., total_strokes: _Optional[int] = ...) -> None: ...

class ActivityLap(_message.Message):
    __slots__ = ("index", "start_time", "elapsed_duration", "moving_duration", "distance_m", "avg_heart_rate_bpm", "max_heart_rate_bpm", "avg_power_w", "max_power_w", "avg_speed_mps", "avg_cadence", "elevation_gain_m", "label")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_DURATION_FIELD_NUMBER: _ClassVar[int]
    MOVING_DURATION_FIELD_NUMBER: _ClassVar[int]
    DISTANCE_M_FIELD_NUMBER: _ClassVar[int]
    AVG_HEART_RATE_BPM_FIELD_NUMBER: _ClassVar[int]
    MAX_HEART_RATE_BPM_FIELD_NUMBER: _ClassVar[int]
    AVG_POWER_W_FIELD_NUMBER: _ClassVar[int]
    MAX_POWER_W_FIELD_NUMBER: _ClassVar[int]
    AVG_SPEED_MPS_FIELD_NUMBER: _ClassVar[int]
    AVG_CADENCE_FIELD_NUMBER: _ClassVar[int]
    ELEVATION_GAIN_M_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    index: int
    start_time: _timestamp_pb2.Timestamp
    elapsed_duration: _duration_pb2.Duration
    moving_duration: _duration_pb2.Duration
    distance_m: float
    avg_heart_rate_bpm: int
    max_heart_rate_bpm: int
    avg_power_w: int
    max_power_w: int
    avg_speed_mps: float
    avg_cadence: int
    elevation_gain_m: float
    label: str
    def __init__(self, index: _Optional[int] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., elapsed_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., moving_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., distance_m: _Optional[float] = ..., avg_heart_rate_bpm: _Optional[int] = ..., max_heart_rate_bpm: _Optional[int] = ..., avg_power_w: _Optional[int] = ..., max_power_w: _Optional[int] = ..., avg_speed_mps: _Optional[float] = ..., avg_cadence: _Optional[int] = ..., elevation_gain_m: _Optional[float] = ..., label: _Optional[str] = ...) -> None: ...

class StreamSummary(_message.Message):
    __slots__ = ("channels", "sample_count", "sample_rate_hz", "has_gps", "polyline")
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HZ_FIELD_NUMBER: _ClassVar[int]
    HAS_GPS_FIELD_NUMBER: _ClassVar[int]
    POLYLINE_FIELD_NUMBER: _ClassVar[int]
    channels: _containers.RepeatedScalarFieldContainer[StreamChannel]
    sample_count: int
    sample_rate_hz: float
    has_gps: bool
    polyline: _common_pb2.EncodedPolyline
    def __init__(self, channels: _Optional[_Iterable[_Union[StreamChannel, str]]] = ..., sample_count: _Optional[int] = ..., sample_rate_hz: _Optional[float] = ..., has_gps: _Optional[bool] = ..., polyline: _Optional[_Union[_common_pb2.EncodedPolyline, _Mapping]] = ...) -> None: ...

class ProviderSegmentEffort(_message.Message):
    __slots__ = ("provider_segment_id", "segment_name", "start_time", "elapsed", "start_index", "end_index")
    PROVIDER_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_NAME_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_FIELD_NUMBER: _ClassVar[int]
    START_INDEX_FIELD_NUMBER: _ClassVar[int]
    END_INDEX_FIELD_NUMBER: _ClassVar[int]
    provider_segment_id: str
    segment_name: str
    start_time: _timestamp_pb2.Timestamp
    elapsed: _duration_pb2.Duration
    start_index: int
    end_index: int
    def __init__(self, provider_segment_id: _Optional[str] = ..., segment_name: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., elapsed: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., start_index: _Optional[int] = ..., end_index: _Optional[int] = ...) -> None: ...

class ProviderBestEffort(_message.Message):
    __slots__ = ("name", "elapsed", "distance_m", "start_index", "end_index")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_FIELD_NUMBER: _ClassVar[int]
    DISTANCE_M_FIELD_NUMBER: _ClassVar[int]
    START_INDEX_FIELD_NUMBER: _ClassVar[int]
    END_INDEX_FIELD_NUMBER: _ClassVar[int]
    name: str
    elapsed: _duration_pb2.Duration
    distance_m: float
    start_index: int
    end_index: int
    def __init__(self, name: _Optional[str] = ..., elapsed: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., distance_m: _Optional[float] = ..., start_index: _Optional[int] = ..., end_index: _Optional[int] = ...) -> None: ...

class ActivitySourcePayload(_message.Message):
    __slots__ = ("type", "discipline", "is_virtual", "is_ebike", "provider_native_type", "title", "description", "start_time", "end_time", "elapsed_duration", "moving_duration", "timezone", "summary", "laps", "stream_summary", "provider_segment_efforts", "provider_best_efforts", "extra", "is_commute", "is_race", "custom_subtype", "gear_external_id", "gear_name")
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DISCIPLINE_FIELD_NUMBER: _ClassVar[int]
    IS_VIRTUAL_FIELD_NUMBER: _ClassVar[int]
    IS_EBIKE_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_NATIVE_TYPE_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_DURATION_FIELD_NUMBER: _ClassVar[int]
    MOVING_DURATION_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    LAPS_FIELD_NUMBER: _ClassVar[int]
    STREAM_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_SEGMENT_EFFORTS_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_BEST_EFFORTS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    IS_COMMUTE_FIELD_NUMBER: _ClassVar[int]
    IS_RACE_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_SUBTYPE_FIELD_NUMBER: _ClassVar[int]
    GEAR_EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    GEAR_NAME_FIELD_NUMBER: _ClassVar[int]
    type: ActivityType
    discipline: Discipline
    is_virtual: bool
    is_ebike: bool
    provider_native_type: str
    title: str
    description: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    elapsed_duration: _duration_pb2.Duration
    moving_duration: _duration_pb2.Duration
    timezone: str
    summary: ActivitySummary
    laps: _containers.RepeatedCompositeFieldContainer[ActivityLap]
    stream_summary: StreamSummary
    provider_segment_efforts: _containers.RepeatedCompositeFieldContainer[ProviderSegmentEffort]
    provider_best_efforts: _containers.RepeatedCompositeFieldContainer[ProviderBestEffort]
    extra: _containers.ScalarMap[str, str]
    is_commute: bool
    is_race: bool
    custom_subtype: str
    gear_external_id: str
    gear_name: str
    def __init__(self, type: _Optional[_Union[ActivityType, str]] = ..., discipline: _Optional[_Union[Discipline, str]] = ..., is_virtual: _Optional[bool] = ..., is_ebike: _Optional[bool] = ..., provider_native_type: _Optional[str] = ..., title: _Optional[str] = ..., description: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., elapsed_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., moving_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., timezone: _Optional[str] = ..., summary: _Optional[_Union[ActivitySummary, _Mapping]] = ..., laps: _Optional[_Iterable[_Union[ActivityLap, _Mapping]]] = ..., stream_summary: _Optional[_Union[StreamSummary, _Mapping]] = ..., provider_segment_efforts: _Optional[_Iterable[_Union[ProviderSegmentEffort, _Mapping]]] = ..., provider_best_efforts: _Optional[_Iterable[_Union[ProviderBestEffort, _Mapping]]] = ..., extra: _Optional[_Mapping[str, str]] = ..., is_commute: _Optional[bool] = ..., is_race: _Optional[bool] = ..., custom_subtype: _Optional[str] = ..., gear_external_id: _Optional[str] = ..., gear_name: _Optional[str] = ...) -> None: ...

class ActivityStream(_message.Message):
    __slots__ = ("activity_source_id", "channels", "sample_count", "resolution_hz", "time_s", "latitude", "longitude", "altitude_m", "distance_m", "speed_mps", "heart_rate_bpm", "power_w", "cadence", "temperature_c", "grade")
    ACTIVITY_SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_HZ_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    LATITUDE_FIELD_NUMBER: _ClassVar[int]
    LONGITUDE_FIELD_NUMBER: _ClassVar[int]
    ALTITUDE_M_FIELD_NUMBER: _ClassVar[int]
    DISTANCE_M_FIELD_NUMBER: _ClassVar[int]
    SPEED_MPS_FIELD_NUMBER: _ClassVar[int]
    HEART_RATE_BPM_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    CADENCE_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    GRADE_FIELD_NUMBER: _ClassVar[int]
    activity_source_id: str
    channels: _containers.RepeatedScalarFieldContainer[StreamChannel]
    sample_count: int
    resolution_hz: float
    time_s: _containers.RepeatedScalarFieldContainer[float]
    latitude: _containers.RepeatedScalarFieldContainer[float]
    longitude: _containers.RepeatedScalarFieldContainer[float]
    altitude_m: _containers.RepeatedScalarFieldContainer[float]
    distance_m: _containers.RepeatedScalarFieldContainer[float]
    speed_mps: _containers.RepeatedScalarFieldContainer[float]
    heart_rate_bpm: _containers.RepeatedScalarFieldContainer[int]
    power_w: _containers.RepeatedScalarFieldContainer[int]
    cadence: _containers.RepeatedScalarFieldContainer[int]
    temperature_c: _containers.RepeatedScalarFieldContainer[float]
    grade: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, activity_source_id: _Optional[str] = ..., channels: _Optional[_Iterable[_Union[StreamChannel, str]]] = ..., sample_count: _Optional[int] = ..., resolution_hz: _Optional[float] = ..., time_s: _Optional[_Iterable[float]] = ..., latitude: _Optional[_Iterable[float]] = ..., longitude: _Optional[_Iterable[float]] = ..., altitude_m: _Optional[_Iterable[float]] = ..., distance_m: _Optional[_Iterable[float]] = ..., speed_mps: _Optional[_Iterable[float]] = ..., heart_rate_bpm: _Optional[_Iterable[int]] = ..., power_w: _Optional[_Iterable[int]] = ..., cadence: _Optional[_Iterable[int]] = ..., temperature_c: _Optional[_Iterable[float]] = ..., grade: _Optional[_Iterable[float]] = ...) -> None: ...
