"""The fairness audit: groups from the static inputs, calibration slope/intercept recovered on
synthetic risks whose miscalibration is known, and the sex-flip distribution."""

from __future__ import annotations

import numpy as np
import pytest

from scehr.training import fairness


def _synthetic(n: int = 20000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    true = 1 / (1 + np.exp(-rng.normal(-1.8, 1.2, n)))
    y = (rng.random(n) < true).astype(float)
    static = np.column_stack([rng.uniform(18, 95, n), rng.integers(0, 2, n).astype(float)])
    return y, true, static


def test_slope_and_intercept_recover_known_miscalibration() -> None:
    y, true, _ = _synthetic()
    slope, intercept = fairness.calibration_slope_intercept(y, true)
    assert slope == pytest.approx(1.0, abs=0.06) and intercept == pytest.approx(0.0, abs=0.05)
    lg = np.log(true / (1 - true))
    too_extreme = 1 / (1 + np.exp(-2 * lg))
    assert fairness.calibration_slope_intercept(y, too_extreme)[0] == pytest.approx(0.5, abs=0.04)
    too_low = 1 / (1 + np.exp(-(lg - 1.0)))  # every risk's odds divided by e
    assert fairness.calibration_slope_intercept(y, too_low)[1] == pytest.approx(1.0, abs=0.06)
    assert np.isnan(fairness.calibration_slope_intercept(np.zeros(5), np.full(5, 0.2))[0])


def test_groups_partition_known_ages_and_skip_unknown() -> None:
    static = np.array([[30, 1], [50, 0], [69.9, np.nan], [70, 1], [80, 0], [np.nan, 1]])
    g = fairness.groups(static)
    bands = np.stack([g[name] for name, _, _ in fairness.AGE_BANDS])
    assert bands.sum(axis=0).tolist() == [1, 1, 1, 1, 1, 0]  # each known age in one band
    assert g["age 50-69"].tolist() == [False, True, True, False, False, False]
    assert g["sex=male"].sum() == 3 and g["sex=female"].sum() == 2 and g["all"].all()


def test_group_table_and_sex_flip_on_synthetic_data() -> None:
    y, true, static = _synthetic(4000, seed=1)
    # A risk that adds 0.1 for men: the flip moves every stay by about 0.1, never more.
    male = static[:, 1] == 1
    risk = np.clip(true + 0.1 * male, 0, 1 - 1e-6)
    flipped = np.clip(true + 0.1 * ~male, 0, 1 - 1e-6)
    static[:7, 1] = np.nan  # unknown sex: left out of the flip and of both sex groups
    a = fairness.audit(y, risk, risk >= 0.3, static, flipped, flipped >= 0.3,
                       where="synthetic", alert_rule="risk >= 0.3")
    rows = a["groups"]
    assert rows["all"]["n"] == 4000 and rows["sex=male"]["n"] + rows["sex=female"]["n"] == 3993
    assert rows["sex=male"]["calibration_intercept"] < -0.2 < rows["sex=female"][
        "calibration_intercept"]  # men's risks too high, women's right
    assert rows["sex=male"]["alert_rate"] > rows["sex=female"]["alert_rate"]
    s = a["sex_flip"]
    assert s["n"] == 3993 and s["max"] <= 0.1 + 1e-9 and s["median"] == pytest.approx(0.1)
    expected = ((risk >= 0.3) != (flipped >= 0.3))[~np.isnan(static[:, 1])].sum()
    assert s["alerts_changed"] == expected > 0
    card = "\n".join(fairness.audit_lines(a))
    assert "## Fairness audit" in card and "What it means" in card and "| sex=male |" in card


def test_a_model_without_sex_says_so() -> None:
    y, true, static = _synthetic(500, seed=2)
    a = fairness.audit(y, true, true >= 0.3, static, true, true >= 0.3, where="x",
                       alert_rule="y")
    assert a["sex_flip"]["max"] == 0 and a["sex_flip"]["alerts_changed"] == 0
    assert "does not read sex" in "\n".join(fairness.audit_lines(a))
    np.testing.assert_array_equal(fairness.flip_sex(np.array([[1.0, 1], [2, np.nan]]))[:, 1],
                                  [0, np.nan])
