from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class ClimbCategory(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLIMB_CATEGORY_UNSPECIFIED: _ClassVar[ClimbCategory]
    CLIMB_CATEGORY_NONE: _ClassVar[ClimbCategory]
    CLIMB_CATEGORY_FOUR: _ClassVar[ClimbCategory]
    CLIMB_CATEGORY_THREE: _ClassVar[ClimbCategory]
    CLIMB_CATEGORY_TWO: _ClassVar[ClimbCategory]
    CLIMB_CATEGORY_ONE: _ClassVar[ClimbCategory]
    CLIMB_CATEGORY_HORS_CATEGORIE: _ClassVar[ClimbCategory]

class BestEffortMetric(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BEST_EFFORT_METRIC_UNSPECIFIED: _ClassVar[BestEffortMetric]
    BEST_EFFORT_METRIC_PACE: _ClassVar[BestEffortMetric]
    BEST_EFFORT_METRIC_SPEED: _ClassVar[BestEffortMetric]
    BEST_EFFORT_METRIC_POWER: _ClassVar[BestEffortMetric]
    BEST_EFFORT_METRIC_HEART_RATE: _ClassVar[BestEffortMetric]
    BEST_EFFORT_METRIC_VAM: _ClassVar[BestEffortMetric]
CLIMB_CATEGORY_UNSPECIFIED: ClimbCategory
CLIMB_CATEGORY_NONE: ClimbCategory
CLIMB_CATEGORY_FOUR: ClimbCategory
CLIMB_CATEGORY_THREE: ClimbCategory
CLIMB_CATEGORY_TWO: ClimbCategory
CLIMB_CATEGORY_ONE: ClimbCategory
CLIMB_CATEGORY_HORS_CATEGORIE: ClimbCategory
BEST_EFFORT_METRIC_UNSPECIFIED: BestEffortMetric
BEST_EFFORT_METRIC_PACE: BestEffortMetric
BEST_EFFORT_METRIC_SPEED: BestEffortMetric
BEST_EFFORT_METRIC_POWER: BestEffortMetric
BEST_EFFORT_METRIC_HEART_RATE: BestEffortMetric
BEST_EFFORT_METRIC_VAM: BestEffortMetric
