"""Pydantic models of the Strava JSON we read (reference §4.2), tolerant by design."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class StravaModel(BaseModel):
    """Every field optional with a neutral default, extras ignored: Strava adds fields and sends nulls.

    Nothing is lost: the raw JSON is archived separately for a later parser.
    """

    model_config = ConfigDict(extra="ignore")

    @field_validator("*", mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info: Any) -> Any:
        """Strava's ``null`` means "unknown": fall back to the field default."""
        if value is None:
            field = cls.model_fields[info.field_name]
            return field.get_default(call_default_factory=True)
        return value


class StravaLap(StravaModel):
    lap_index: int = 0
    name: str = ""
    start_date: str = ""
    elapsed_time: float = 0
    moving_time: float = 0
    distance: float = 0
    average_speed: float = 0
    average_heartrate: float = 0
    max_heartrate: float = 0
    average_watts: float = 0
    average_cadence: float = 0
    total_elevation_gain: float = 0


class StravaGearSummary(StravaModel):
    id: str = ""
    name: str = ""
    primary: bool = False
    distance: float = 0
    retired: bool = False


class StravaGear(StravaModel):
    """DetailedGear from ``GET /gear/{id}`` (also reads SummaryGear from ``/athlete``)."""

    id: str = ""
    name: str = ""
    primary: bool = False
    distance: float = 0
    retired: bool = False
    brand_name: str = ""
    model_name: str = ""
    description: str = ""
    frame_type: int = 0


class StravaAthleteRef(StravaModel):
    id: int = 0


class StravaMap(StravaModel):
    polyline: str = ""


class StravaSegment(StravaModel):
    """SummarySegment (inside an effort) or DetailedSegment (``GET /segments/{id}``, adds the
    polyline and ``total_elevation_gain``); reference §4.2."""

    id: int = 0
    name: str = ""
    activity_type: str = ""
    distance: float = 0
    average_grade: float = 0
    maximum_grade: float = 0
    elevation_high: float = 0
    elevation_low: float = 0
    total_elevation_gain: float = 0
    climb_category: int = 0
    starred: bool = False
    map: StravaMap = Field(default_factory=StravaMap)


class StravaSegmentEffort(StravaModel):
    id: int = 0
    elapsed_time: float = 0
    moving_time: float = 0
    start_date: str = ""
    distance: float = 0
    start_index: int = 0
    end_index: int = 0
    average_heartrate: float = 0
    max_heartrate: float = 0
    average_watts: float = 0
    average_cadence: float = 0
    segment: StravaSegment = Field(default_factory=StravaSegment)


class StravaPhoto(StravaModel):
    """One entry of ``GET /activities/{id}/photos`` or the detail's ``photos.primary``:
    ``urls`` and ``sizes`` are keyed by the size in pixels (``"2048"``, ``"600"``)."""

    unique_id: str = ""
    caption: str = ""
    urls: dict[str, Any] = Field(default_factory=dict)
    sizes: dict[str, Any] = Field(default_factory=dict)


class StravaActivity(StravaModel):
    id: int = 0
    name: str = ""
    description: str = ""
    type: str = ""
    sport_type: str = ""
    start_date: str = ""
    start_date_local: str = ""
    timezone: str = ""
    elapsed_time: float = 0
    moving_time: float = 0
    distance: float = 0
    total_elevation_gain: float = 0
    elev_high: float = 0
    elev_low: float = 0
    average_speed: float = 0
    max_speed: float = 0
    average_heartrate: float = 0
    max_heartrate: float = 0
    has_heartrate: bool = False
    average_watts: float = 0
    weighted_average_watts: float = 0
    max_watts: float = 0
    average_cadence: float = 0
    average_temp: float = 0
    calories: float = 0
    kilojoules: float = 0
    trainer: bool = False
    commute: bool = False
    manual: bool = False
    workout_type: int = 0
    gear_id: str = ""
    gear: StravaGearSummary = Field(default_factory=StravaGearSummary)
    device_name: str = ""
    athlete: StravaAthleteRef = Field(default_factory=StravaAthleteRef)
    laps: list[StravaLap] = Field(default_factory=list)


class StravaSummaryActivity(StravaModel):
    """One entry of ``GET /athlete/activities``: only what listings need."""

    id: int = 0
    name: str = ""
    start_date: str = ""
