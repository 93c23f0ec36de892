"""The alert policy of a risk trajectory: when an hourly risk raises an alert event, as one rule.

A risk watched every hour would alert every hour while it stays high; clinicians silence such a
system. The policy (chosen on validation, stored in the manifest's `trajectory` section) raises
an alert when the risk reaches the threshold, then stays silent for `silence_hours` unless the
risk rises by `realert_rise` above the risk of the last alert. Training (choosing the policy,
evaluating it) and the service (serving alert events) both call `alert_hours`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class AlertPolicy(BaseModel):
    """Threshold on the calibrated risk, a silencing window and a re-alert rise."""

    model_config = ConfigDict(extra="forbid")

    threshold: float = Field(gt=0.0, lt=1.0, description="Alert when the risk is at least this")
    silence_hours: int = Field(ge=0, description="No new alert within this many hours of the "
                               "last one ...")
    realert_rise: float = Field(gt=0.0, le=1.0, description="... unless the risk rose by at "
                                "least this much since the last alert")
    rule: str = Field("", description="How the policy was chosen, in words")
    validation: dict[str, Any] = Field(
        default_factory=dict, description="Its figures on the validation split that chose it "
        "(alerts per patient-day, share of deaths alerted, ...)")


def alert_hours(policy: AlertPolicy, hours: Sequence[int],
                risks: Sequence[float | None]) -> list[int]:
    """The hours (ascending) at which the policy raises an alert; None risks (abstained) never
    alert and do not end a silence."""
    out: list[int] = []
    last_hour, last_risk = -1, 0.0
    for h, r in sorted(zip(hours, risks, strict=True)):
        if r is None or r < policy.threshold:
            continue
        if (not out or h - last_hour >= policy.silence_hours
                or r - last_risk >= policy.realert_rise - 1e-12):
            out.append(h)
            last_hour, last_risk = h, r
    return out
