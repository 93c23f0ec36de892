"""Landmark runs: (stay, hour) training rows, the trajectory section chosen on validation, and
the exported graph whose hour-48 risk is the full stay's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from scehr.schemas.alert_policy import AlertPolicy
from scehr.schemas.contract import PROBABILITY_BY_HOUR
from scehr.schemas.manifest import load_manifest
from scehr.training.config import TrainConfig
from scehr.training.encoders import CausalSummaryLSTM
from scehr.training.fit import AnchorModel, prepare
from scehr.training.heads import AnchorHead
from scehr.training.landmark import LandmarkObjective
from scehr.training.landmark_assets import alert_figures, bands_of


def test_rows_are_the_drawn_hours_of_the_stays_still_there() -> None:
    torch.manual_seed(0)
    enc = CausalSummaryLSTM(4, 0, units=3, summary_dim=2, widths=[1, 1]).eval()
    model = AnchorModel(enc, AnchorHead(enc.out_dim, 1))
    x = torch.randn(3, 10, 4)
    lengths, y = torch.tensor([10, 5, 2]), torch.tensor([[1.0], [0.0], [1.0]])
    obj = LandmarkObjective(first_hour=3, hours_per_batch=4)
    gen = torch.Generator().manual_seed(1)
    hours = obj.draw_hours(10, torch.Generator().manual_seed(1))
    assert len(set(hours.tolist())) == 4 and hours.min() >= 3 and hours.max() <= 10
    z, logits, yy = obj.rows(model, x, lengths, None, y, gen)
    # stay 0 gives every drawn hour, stay 1 those <= 5, stay 2 none (left at hour 2 < 3)
    n1 = int((hours <= 5).sum())
    assert z.shape == (4 + n1, enc.out_dim) and logits.shape == (4 + n1, 1, 2)
    assert yy[:, 0].tolist() == [1.0] * 4 + [0.0] * n1
    with torch.no_grad():
        steps = enc.steps(x, lengths)
    torch.testing.assert_close(z[:4], steps[0, hours - 1])
    with pytest.raises(ValueError, match="unknown keys"):
        LandmarkObjective.from_config({"hours": 3})


def test_alert_figures_count_alerts_per_day_and_deaths_alerted() -> None:
    p = AlertPolicy(threshold=0.5, silence_hours=24, realert_rise=0.3)
    nan = np.nan
    risks = np.array([[nan, 0.6, 0.6, 0.95],   # died: alerts at 2 and 4 (rise 0.35)
                      [nan, 0.1, 0.2, 0.3],    # died: never alerted
                      [nan, 0.2, 0.7, nan]])   # survived: alert at 3
    f = alert_figures(p, risks, np.array([1, 1, 0]))
    assert f["alerts_per_patient_day"] == pytest.approx(3 / (8 / 24))
    assert f["deaths_alerted"] == 0.5 and f["survivors_alerted"] == 1.0
    assert f["median_hours_first_alert_to_end"] == 2.0  # first alert at hour 2 of 4
    assert bands_of(6, 48) == [(6, 11), (12, 23), (24, 35), (36, 48)]
    assert bands_of(13, 48) == [(13, 23), (24, 35), (36, 48)]


def test_trains_exports_and_the_hour_48_risk_is_the_full_stays(
        landmark: tuple[Path, TrainConfig]) -> None:
    models, cfg = landmark
    (folder,) = (models / "mortality-landmark").iterdir()
    m = load_manifest(folder / "manifest.json")
    t = m.trajectory
    assert m.task == "mortality-landmark" and t is not None and t.last_hour == 48
    assert t.bands[0].from_hour == t.first_hour and t.bands[-1].to_hour == 48
    assert all(b.uncertainty is not None and b.data_minimum is not None for b in t.bands)
    assert t.alert_policy.rule and "deaths_alerted" in t.alert_policy.validation
    assert PROBABILITY_BY_HOUR.name in m.onnx.outputs
    assert max(m.onnx.parity_max_abs_error.values()) <= 1e-5

    test = prepare(cfg).test
    session = ort.InferenceSession(str(folder / "model.onnx"))
    feed = {"x": test.x.numpy(), "lengths": test.lengths.numpy(), "static": test.static.numpy()}
    p, by_hour = session.run(["probability", PROBABILITY_BY_HOUR.name], feed)
    assert by_hour.shape == (len(test), 48, 1)
    np.testing.assert_allclose(by_hour[:, 47], p, atol=1e-6, rtol=0)


def test_the_policy_and_first_hour_are_chosen_by_their_rules() -> None:
    from scehr.training.landmark_assets import choose_policy, first_hour

    def pol(t: float) -> AlertPolicy:
        return AlertPolicy(threshold=t, silence_hours=6, realert_rise=0.1)

    grid = [(pol(0.1), {"alerts_per_patient_day": 0.5, "deaths_alerted": 0.95}),
            (pol(0.2), {"alerts_per_patient_day": 0.29, "deaths_alerted": 0.7}),
            (pol(0.3), {"alerts_per_patient_day": 0.2, "deaths_alerted": 0.7}),
            (pol(0.4), {"alerts_per_patient_day": 0.1, "deaths_alerted": 0.5})]
    chosen = choose_policy(grid)  # within 0.3/day the most deaths, then the fewest alerts
    assert chosen.threshold == 0.3 and "is met" in chosen.rule
    assert chosen.validation["deaths_alerted"] == 0.7
    over = choose_policy(grid[:1])  # nothing within the budget: the fewest alerts, said so
    assert over.threshold == 0.1 and "no policy" in over.rule and "is not met" in over.rule

    rng = np.random.default_rng(0)
    y = np.r_[np.ones(50), np.zeros(150)]
    noise = rng.standard_normal((200, 10))
    signal = np.linspace(0.0, 3.0, 10)  # the risk separates the outcomes more every hour
    preds = {"probability": 1 / (1 + np.exp(-(noise + y[:, None] * signal))),
             "margin": noise, "y": y, "inside": np.ones((200, 10), bool)}
    aurocs = [auroc_of(preds, h) for h in range(1, 11)]
    expected = next(h for h in range(1, 11) if min(aurocs[h - 1:]) >= 0.75)
    assert first_hour(preds, 10) == expected and 1 < expected < 10


def auroc_of(preds: dict[str, np.ndarray], h: int) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(preds["y"], preds["probability"][:, h - 1]))
