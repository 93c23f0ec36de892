"""The answer of a trajectory route: a landmark model's risk at every hour of a stay.

One entry per hour h = 1..min(hours of data, the model's last landmark), each the risk given
the data up to h, scored or abstained (with why); then the alert events the manifest's alert
policy raises on them. Kept apart from `payloads` (the 48-hour answer), whose models they
reuse.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from scehr.schemas.alert_policy import AlertPolicy
from scehr.schemas.payloads import Audit, ModelRef, Notice, Problem, RiskInterval


class HourReason(BaseModel):
    """Why an hour abstained."""

    code: Literal["before_first_landmark", "below_data_minimum"]
    message: str


class TrajectoryHour(BaseModel):
    """The risk at one hour, from the data up to that hour only."""

    hour: int = Field(description="Hours since admission; the data up to it was read")
    status: Literal["scored", "abstained"]
    risk: float | None = Field(description="The calibrated risk (the hour's band's map); "
                               "null when abstained")
    score: float | None = Field(description="The model's uncalibrated read-out at this hour; "
                                "not a probability to show")
    interval: RiskInterval | None = Field(
        None, description="The risk's uncertainty (the hour's band's map); null when abstained "
        "or when the band carries no map")
    reasons: list[HourReason] = Field(default_factory=list,
                                      description="Why the hour abstained (empty when scored)")
    alert: bool = Field(description="The risk is at or above the alert policy's threshold "
                        "(`alerts` says when an alert is raised)")


class AlertEvent(BaseModel):
    """An alert the policy raises: the first hour at the threshold, another once the silence
    window is over, or within it when the risk rose by `realert_rise` since the last alert."""

    hour: int
    risk: float


class TrajectoryPrediction(BaseModel):
    """A stay's risk trajectory. `status` is the last hour's (the risk now)."""

    response_version: str
    id: str | None = None
    model: ModelRef
    label: str = Field(description="The outcome the risk is of")
    status: Literal["scored", "insufficient_data"] = Field(
        description="`scored` when the last hour is scored, else `insufficient_data`")
    hours: list[TrajectoryHour] = Field(description="Hour 1 first")
    alerts: list[AlertEvent] = Field(description="The policy's alert events, earliest first")
    alert_policy: AlertPolicy = Field(description="The model's policy (its manifest's)")
    warnings: list[Notice] = Field(default_factory=list)
    audit: Audit


class TrajectoryBatchItem(BaseModel):
    index: int
    id: str | None = None
    trajectory: TrajectoryPrediction | None = None
    errors: list[Problem] | None = None


class TrajectoryBatchResponse(BaseModel):
    response_version: str
    model: ModelRef
    items: list[TrajectoryBatchItem]
