"""The landmark task, the manifest's `trajectory` section and the alert policy's one rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from scehr.schemas.alert_policy import AlertPolicy, alert_hours
from scehr.schemas.manifest import Manifest, Trajectory
from scehr.schemas.tasks import MORTALITY, task_spec

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "mortality" / "1.3.2" / "manifest.json"
POLICY = {"threshold": 0.3, "silence_hours": 6, "realert_rise": 0.1}


def trajectory(bands: list[tuple[int, int]], first: int = 6, last: int = 48) -> dict[str, Any]:
    cal = {"method": "temperature", "input": "margin", "temperature": 1.5}
    return {"first_hour": first, "last_hour": last, "alert_policy": POLICY,
            "bands": [{"from_hour": a, "to_hour": b, "calibration": cal} for a, b in bands]}


def test_the_landmark_task_is_mortality_given_at_every_hour() -> None:
    spec = task_spec("landmark-mortality")
    assert spec.name == "mortality-landmark" and spec.landmarks and not MORTALITY.landmarks
    assert (spec.label_names, spec.feature_set, spec.window_hours, spec.data_dir) == (
        MORTALITY.label_names, MORTALITY.feature_set, MORTALITY.window_hours, MORTALITY.data_dir)


def test_bands_must_be_consecutive_and_cover_first_to_last_hour() -> None:
    t = Trajectory.model_validate(trajectory([(6, 11), (12, 23), (24, 48)]))
    assert [t.band(h) and t.band(h).from_hour for h in (5, 6, 11, 12, 30, 48, 49)] == [
        None, 6, 6, 12, 24, 24, None]
    with pytest.raises(ValidationError, match=r"bands\[1\]: from_hour must be 12"):
        Trajectory.model_validate(trajectory([(6, 11), (13, 48)]))
    with pytest.raises(ValidationError, match="must end at last_hour 48, not 40"):
        Trajectory.model_validate(trajectory([(6, 11), (12, 40)]))
    with pytest.raises(ValidationError, match=r"bands\[0\]: from_hour must be 6"):
        Trajectory.model_validate(trajectory([(1, 48)]))


def test_a_landmark_manifest_needs_a_trajectory_and_only_it_may_have_one() -> None:
    raw = json.loads(SHIPPED.read_text())
    Manifest.model_validate(raw)  # a 1.4 manifest of the 48-hour task still loads
    with pytest.raises(ValidationError, match="a mortality manifest must not have one"):
        Manifest.model_validate({**raw, "trajectory": trajectory([(6, 48)])})
    with pytest.raises(ValidationError, match="a mortality-landmark manifest must have one"):
        Manifest.model_validate({**raw, "task": "mortality-landmark"})
    m = Manifest.model_validate({**raw, "task": "mortality-landmark",
                                 "trajectory": trajectory([(6, 23), (24, 48)])})
    assert m.trajectory is not None and m.trajectory.band(30).from_hour == 24


def test_the_policy_silences_repeats_unless_the_risk_rises() -> None:
    p = AlertPolicy.model_validate(POLICY)
    hours = list(range(1, 16))
    risks: list[float | None] = [0.1, 0.35, 0.36, 0.4, None, 0.3, 0.2, 0.9, 0.5, 0.5, 0.5, 0.5,
                                 0.5, 0.5, 0.55]
    # 2: first at the threshold; 8: +0.54 since the last alert; 14: six hours after 8
    assert alert_hours(p, hours, risks) == [2, 8, 14]
    assert alert_hours(p, hours, [None] * 15) == []
    assert alert_hours(p.model_copy(update={"silence_hours": 0}), [1, 2, 3],
                       [0.3, 0.3, 0.29]) == [1, 2]
    with pytest.raises(ValidationError, match="threshold"):
        AlertPolicy.model_validate({**POLICY, "threshold": 1.0})
