"""The trajectory read-out (one data summary of the stay for all hours, bands read as arrays)
against the rule applied hour by hour: each hour's band, `summarize` of the data up to it,
`shortfalls`, the band's calibration. On the shipped landmark model and the example stay,
whole and cut or thinned so that hours of every status occur."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scehr.schemas.contract import RESPONSE_VERSION
from scehr.schemas.payloads import StayPayload
from scehr.schemas.sufficiency import shortfalls, summarize
from scehr.service.pipeline import prepare
from scehr.service.registry import LoadedModel, load_model
from scehr.service.settings import Settings
from scehr.service.trajectory import trajectories

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
STAY = json.loads((REPO / "examples" / "mortality_stay.json").read_text())


@pytest.fixture(scope="module")
def landmark() -> LoadedModel:
    settings = Settings(model_dir=MODELS, device="cpu", intra_op_threads=1)
    return load_model(MODELS / "mortality-landmark" / "1.0.0", "mortality-landmark", settings)


def variants() -> list[dict[str, Any]]:
    """The example stay whole, cut at 20 h and 7 h, and with every third observation only."""
    obs = STAY["observations"]
    return [STAY, {**STAY, "observations": [o for o in obs if o["time"] <= 20]},
            {**STAY, "observations": [o for o in obs if o["time"] <= 7]},
            {**STAY, "observations": obs[::3]}]


def test_read_out_equals_the_rule_hour_by_hour(landmark: LoadedModel) -> None:
    seen: set[str] = set()
    for stay in variants():
        seen |= compare(landmark, stay)
    assert seen == {"below_data_minimum", "scored"}  # both cases were compared


def compare(landmark: LoadedModel, stay: dict[str, Any]) -> set[str]:
    """Checks every hour of `stay`'s trajectory against the rule; the cases it compared."""
    spec = landmark.spec
    traj = spec.manifest.trajectory
    assert traj is not None
    prep = prepare(spec, [StayPayload.model_validate(stay)])
    assert prep.ok == [0] and prep.inputs is not None and prep.observations is not None
    out = landmark.run(prep.inputs)
    got = trajectories(spec, prep, out, RESPONSE_VERSION)[0].model_dump()["hours"]
    assert out.probability_by_hour is not None and out.anchor_logits_by_hour is not None
    p = out.probability_by_hour[0, :, 0].astype(np.float64)
    al = out.anchor_logits_by_hour[0, :, 0].astype(np.float64)
    seen: set[str] = set()
    for e in got:
        h = e["hour"]
        band = [b for b in traj.bands if b.from_hour <= h <= b.to_hour]
        if not band:
            assert h < traj.first_hour and e["status"] == "abstained"
            continue
        (band,) = band
        short = [] if band.data_minimum is None else shortfalls(
            summarize(prep.observations, np.array([float(h)]), spec.fs)[0], band.data_minimum)
        if short:
            assert e["status"] == "abstained" and e["risk"] is None
            seen.add("below_data_minimum")
            assert e["reasons"][0]["message"] == "; ".join(short)
        else:
            risk = band.calibration.apply(p[h - 1:h], al[h - 1:h, 0] - al[h - 1:h, 1])
            assert e["status"] == "scored" and e["risk"] == float(risk[0])
            seen.add("scored")
    assert len(got) >= 7
    return seen
