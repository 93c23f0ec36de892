"""A landmark band's data minimum is chosen on validation by the 48-hour study's rule, applied
to the band's (stay, hour) rows grouped by the data each holds up to its hour."""

from __future__ import annotations

import numpy as np

from scehr.training.landmark_assets import HELD_FIELDS, band_minimum
from scehr.training.sufficiency import MAX_ECE, choose, study_by_level


def known_rows(seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray,
                                       np.ndarray]:
    """Validation of 1500 stays x 4 hours: rows holding 1-3 observations get an uninformative
    risk (0.3, the outcome rate there), rows holding 5 or more a calibrated, informative one."""
    rng = np.random.default_rng(seed)
    n, t = 1500, 4
    obs = rng.choice([1, 2, 3, 5, 10, 20], size=(n, t)).astype(float)
    informative = obs >= 5
    p = np.where(informative, rng.uniform(0.02, 0.98, (n, t)), 0.3)
    y_rows = (rng.random((n, t)) < p).astype(float)
    held = {"observations": obs, "channels": np.full((n, t), 3.0),
            "hours_covered": np.full((n, t), 0.5), "hours_since_last": np.full((n, t), 1.0)}
    assert set(held) == set(HELD_FIELDS)
    return y_rows, held, p, np.ones((n, t), dtype=bool)


def test_the_band_minimum_is_the_least_data_whose_rows_validation_supports() -> None:
    y_rows, held, p, inside = known_rows()
    # `rows` order: row-major over (stay, hour) of the band
    m = band_minimum(inside, held, y_rows.ravel(), p.ravel(), 1, 4)
    assert m.min_observations == 5  # 1, 2 and 3 observations: AUROC 0.5, far below all rows'
    assert m.min_channels == 3 and m.min_hours_covered == 0.0
    assert m.max_hours_since_last == 2  # every row's last observation is 1 h before its hour
    assert "validation" in m.rule and "hours 1-4" in m.rule and "6000 rows of 1500 stays" in m.rule
    v = m.validation
    assert v is not None and v.n == 6000
    assert v.kept == int((held["observations"] >= 5).sum())
    assert v.auroc is not None and v.auroc_all is not None and v.auroc > v.auroc_all + 0.05


def test_hours_outside_the_band_or_the_population_take_no_part() -> None:
    y_rows, held, p, inside = known_rows()
    # hours 3-4 only, and stays gone after hour 3: those rows never reach the study
    inside[:500, 3] = False
    cols = slice(2, 4)
    keep = inside[:, cols]
    m = band_minimum(inside, held, y_rows[:, cols][keep], p[:, cols][keep], 3, 4)
    assert m.validation is not None and m.validation.n == int(keep.sum()) == 2500
    assert "hours 3-4" in m.rule


def test_levels_with_too_few_outcomes_give_no_evidence_and_no_minimum_below_them() -> None:
    rng = np.random.default_rng(1)
    y = (rng.random(500) < 0.3).astype(float)
    risk = np.clip(0.3 + 0.4 * (y - 0.3) + rng.normal(0, 0.1, 500), 0.01, 0.99)
    obs = np.where(np.arange(500) < 5, 1.0, 50.0)  # 5 rows hold 1 observation: no evidence
    res = study_by_level(y, risk, {"observations": obs, "channels": np.full(500, 8.0),
                                   "hours_covered": np.full(500, 30.0),
                                   "hours_since_last": np.full(500, 3.0)})
    assert [r["level"] for r in res["observations"]] == [50]
    pick = choose(res)
    ok = res["observations"][0]["ece"] <= MAX_ECE
    assert pick["observations"] == (50 if ok else None)
    assert pick["hours_since_last"] in (6, None) and pick["hours_covered"] in (24, None)


def test_the_trajectory_abstains_at_the_hours_below_their_bands_minimum() -> None:
    from scehr.schemas.alert_policy import AlertPolicy
    from scehr.schemas.manifest import Trajectory
    from scehr.training.landmark_assets import band, below_minimum

    y_rows, held, p, inside = known_rows()
    y = y_rows[:, -1]  # one outcome per stay
    preds = {"probability": p, "margin": np.log(p / (1 - p)), "y": y, "inside": inside}
    policy = AlertPolicy(threshold=0.5, silence_hours=0, realert_rise=1.0)
    traj = Trajectory(first_hour=2, last_hour=4, alert_policy=policy,
                      bands=[band(preds, preds, preds, held, 2, 3, "margin"),
                             band(preds, preds, preds, held, 4, 4, "margin")])
    for b in traj.bands:
        assert b.data_minimum is not None and "validation" in b.data_minimum.rule
    below = below_minimum(traj, held)
    for h in range(traj.first_hour, 5):
        m = traj.band(h).data_minimum
        np.testing.assert_array_equal(below[:, h - 1], held["observations"][:, h - 1]
                                      < m.min_observations)
    assert below.any()
    assert not below[:, 0].any()  # hour 1 is before the first band: abstained for that reason
