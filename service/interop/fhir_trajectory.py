"""FHIR R4 out for a trajectory: one RiskAssessment per scored hour, and an OperationOutcome.

Each RiskAssessment is the risk at hour h: `occurrenceDateTime` is the ICU admission + h hours
and its `basis` the Observations the model read up to h (no later one reached it). Abstained
hours get no RiskAssessment: the OperationOutcome says which hours and why, one issue per run
of consecutive hours with the same reason (bounded, however long the stay).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from itertools import groupby

from scehr.schemas.trajectory_payloads import TrajectoryHour, TrajectoryPrediction
from scehr.service.interop.fhir_in import FhirStay
from scehr.service.interop.fhir_out import (
    MODEL_SYSTEM,
    Json,
    assessment,
    collection,
    outcome_concept,
    outcome_resource,
    risk_interval_extension,
    warning_issue,
)
from scehr.service.interop.readout import interval_words

#: Hours read-outs are compared in (an observation at exactly hour h belongs to hour h).
HOUR_EPS = 1e-6


def _rationale(h: TrajectoryHour, t: TrajectoryPrediction) -> str:
    assert h.risk is not None
    where = "at or above" if h.alert else "below"
    return (f"Risk {h.risk:.1%} at hour {h.hour}, from the data up to that hour: {where} the "
            f"alert policy's threshold ({t.alert_policy.threshold:.1%}). "
            + interval_words(h.interval))


def hour_assessment(h: TrajectoryHour, t: TrajectoryPrediction, stay: FhirStay,
                    when: datetime, basis: list[str]) -> Json:
    """The risk at one scored hour as a RiskAssessment."""
    prediction: Json = {}
    if (ext := risk_interval_extension(h.interval)) is not None:
        prediction["extension"] = ext
    prediction |= {"outcome": outcome_concept(t.label), "probabilityDecimal": h.risk,
                   "rationale": _rationale(h, t)}
    return assessment(t.model, f"{t.model.name}:{t.label}:hour-{h.hour}", stay, when, basis,
                      prediction)


def _abstentions(t: TrajectoryPrediction) -> list[Json]:
    """One issue per run of consecutive abstained hours with the same reason."""
    issues = []
    abstained = [h for h in t.hours if h.status == "abstained"]
    runs = groupby(enumerate(abstained), key=lambda kh: (kh[1].hour - kh[0],
                                                         kh[1].reasons[0].code))
    for (_, code), run in runs:
        hours = [h for _, h in run]
        span = (f"hour {hours[0].hour}" if len(hours) == 1
                else f"hours {hours[0].hour}-{hours[-1].hour}")
        issues.append(warning_issue(
            "incomplete", {"coding": [{"system": MODEL_SYSTEM, "code": code}], "text": code},
            f"no risk at {span} with {t.model.name} {t.model.version} (at hour "
            f"{hours[-1].hour}: {hours[-1].reasons[0].message}). No RiskAssessment is given "
            "for these hours.", None))
    return issues


def trajectory_bundle(t: TrajectoryPrediction, stay: FhirStay, admission: datetime,
                      rows: Sequence[int] | None, times: Sequence[float] | None,
                      when: datetime | None = None) -> Json:
    """A collection Bundle: the scored hours' RiskAssessments, hour 1 first, then the
    OperationOutcome when there is one. `rows`/`times`: the payload observations the model
    read and their hours (`StayResult.rows_at`; None: every reference for every hour)."""
    when = when or datetime.now(UTC)
    entries = []
    for h in t.hours:
        if h.status != "scored":
            continue
        upto = None if rows is None or times is None else [
            r for r, at in zip(rows, times, strict=True) if at <= h.hour + HOUR_EPS]
        entries.append(hour_assessment(h, t, stay, admission + timedelta(hours=h.hour),
                                       stay.contributed(upto)))
    return collection(entries, outcome_resource(stay.issues, _abstentions(t), t.warnings, stay),
                      when)
