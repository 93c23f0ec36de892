"""A landmark model's outputs read as a trajectory: the risk at every hour of a stay.

The graph runs once per stay; its per-step outputs (`probability_by_hour`,
`anchor_logits_by_hour`) give, at step h-1, the risk from the data up to hour h. Each hour h
from 1 to min(the stay's hours, the manifest's last landmark) is read with its band's
calibration, uncertainty map and data minimum (measured on the data up to h); hours before the
first landmark abstain. The manifest's alert policy (`scehr.schemas.alert_policy.alert_hours`,
the one rule training evaluates too) turns the scored hours into alert events.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scehr.schemas.alert_policy import alert_hours
from scehr.schemas.manifest import Trajectory, TrajectoryBand
from scehr.schemas.sufficiency import EPS, DataSummary, shortfalls, summarize_by_hour
from scehr.schemas.trajectory_payloads import TrajectoryPrediction
from scehr.service.batcher import ModelOutputs
from scehr.service.model import ModelSpec
from scehr.service.pipeline import PreparedStays
from scehr.service.responses import SCORED_ONLY_NOTICES, audit_record, risk_intervals

#: The audit line's operating point of a trajectory: its alerts are the policy's.
POLICY_POINT = "alert_policy"
#: The class a trajectory reads (landmark tasks are binary).
CLASS = 0
#: Notices untrue of a trajectory: it ends with the data, nothing is carried forward past it.
NOT_TRAJECTORY_NOTICES = frozenset({"stay_shorter_than_window"})


def served_trajectory(spec: ModelSpec) -> Trajectory:
    """The model's `trajectory` section; ValueError for a model without one (not a landmark
    model: the routes refuse it before scoring)."""
    traj = spec.manifest.trajectory
    if traj is None:
        raise ValueError(f"{spec.task} model {spec.ref.version} serves no trajectory")
    return traj


def _before_first(traj: Trajectory) -> dict[str, str]:
    return {"code": "before_first_landmark", "message": f"no risk before hour "
            f"{traj.first_hour}: the model's earliest supported landmark (chosen on "
            "validation)"}


def _band_hours(band: TrajectoryBand, hours: np.ndarray, p: np.ndarray, margin: np.ndarray,
                data: list[DataSummary] | None) -> list[dict[str, Any]]:
    """The hours of one band (all inside it), as `TrajectoryHour` fields; `data`: the stay's
    data up to each of those hours (None: no band of the model has a data minimum)."""
    risk = band.calibration.apply(p, margin)
    intervals = risk_intervals(band.uncertainty, risk)
    why: list[list[str]] = [[] for _ in hours]
    if band.data_minimum is not None:
        assert data is not None
        why = [shortfalls(d, band.data_minimum) for d in data]
    out = []
    for h, rk, s, iv, short in zip(hours.tolist(), risk.tolist(), p.tolist(), intervals, why,
                                   strict=True):
        if short:
            out.append({"hour": h, "status": "abstained", "risk": None, "score": None,
                        "reasons": [{"code": "below_data_minimum",
                                     "message": "; ".join(short)}]})
        else:
            out.append({"hour": h, "status": "scored", "risk": rk, "score": s, "interval": iv})
    return out


def stay_trajectory(spec: ModelSpec, prep: PreparedStays, r: int, idx: int,
                    p: np.ndarray, margin: np.ndarray, response_version: str
                    ) -> TrajectoryPrediction:
    """Row `r` (input stay `idx`) from its per-hour probability and margin, hour 1 first."""
    traj = served_trajectory(spec)
    hours = np.arange(1, len(p) + 1)
    entries: list[dict[str, Any]] = [
        {"hour": h, "status": "abstained", "risk": None, "score": None,
         "reasons": [_before_first(traj)]} for h in range(1, min(traj.first_hour, len(p) + 1))]
    # the data up to every hour in one pass over the stay (not one per band)
    data = None
    if any(band.data_minimum is not None for band in traj.bands):
        assert prep.observations is not None
        data = summarize_by_hour(prep.observations, r, hours, spec.fs)
    for band in traj.bands:
        sel = (hours >= band.from_hour) & (hours <= band.to_hour)
        if sel.any():
            band_data = None if data is None else [d for d, s in zip(data, sel.tolist(),
                                                                     strict=True) if s]
            entries += _band_hours(band, hours[sel], p[sel], margin[sel], band_data)
    policy = traj.alert_policy
    for e in entries:
        e["alert"] = e["risk"] is not None and e["risk"] >= policy.threshold
    raised = alert_hours(policy, [e["hour"] for e in entries], [e["risk"] for e in entries])
    risk_at = {e["hour"]: e["risk"] for e in entries}
    scored_now = bool(entries) and entries[-1]["status"] == "scored"
    return TrajectoryPrediction.model_validate({
        "response_version": response_version, "id": prep.ids[idx], "model": spec.ref,
        "label": spec.assets.labels[CLASS],
        "status": "scored" if scored_now else "insufficient_data", "hours": entries,
        "alerts": [{"hour": h, "risk": risk_at[h]} for h in raised], "alert_policy": policy,
        "warnings": [n for n in prep.notices[idx] if n.code not in NOT_TRAJECTORY_NOTICES
                     and (scored_now or n.code not in SCORED_ONLY_NOTICES)],
        "audit": audit_record(spec, prep, r, POLICY_POINT, response_version)})


def trajectories(spec: ModelSpec, prep: PreparedStays, out: ModelOutputs,
                 response_version: str) -> dict[int, TrajectoryPrediction]:
    """One trajectory per stay that passed, keyed by its input index: hours 1 to the end of
    its data (`PreparedStays.data_end`), within its steps and the last landmark."""
    traj = served_trajectory(spec)
    if out.probability_by_hour is None or out.anchor_logits_by_hour is None:
        raise ValueError(f"{spec.task} model {spec.ref.version}: the run fetched no per-hour "
                         "outputs")
    assert prep.inputs is not None
    n = len(prep.ok)
    p = out.probability_by_hour[:n, :, CLASS].astype(np.float64)
    al = out.anchor_logits_by_hour[:n, :, CLASS].astype(np.float64)
    margin = al[..., 0] - al[..., 1]
    # hours of data: up to the stay's end (never a step past its run, nor the last landmark)
    ends = np.ceil(np.asarray(prep.data_end, dtype=np.float64) - EPS).astype(np.int64)
    lengths = np.clip(np.minimum(ends, prep.inputs.lengths[:n]), 1, traj.last_hour).tolist()
    return {idx: stay_trajectory(spec, prep, r, idx, p[r, :lengths[r]], margin[r, :lengths[r]],
                                 response_version)
            for r, idx in enumerate(prep.ok)}
