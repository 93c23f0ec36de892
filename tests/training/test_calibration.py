"""ECE/reliability, temperature, Platt and isotonic calibrators, operating points."""

import itertools
import json

import numpy as np
import pytest

from scehr.schemas.contract import RISK_EPS
from scehr.training.calibration import (
    IsotonicCalibrator,
    PlattCalibrator,
    TemperatureCalibrator,
    apply_calibration,
    expected_calibration_error,
    operating_points,
    reliability_curve,
    sigmoid,
)


def _ece_loop(y, p, n_bins):
    edges = np.linspace(0, 1, n_bins + 1)
    total = 0.0
    for b in range(n_bins):
        lo, hi = edges[b], edges[b + 1]
        m = (p >= lo) & ((p < hi) if b < n_bins - 1 else (p <= hi))
        if m.any():
            total += m.sum() / len(p) * abs(y[m].mean() - p[m].mean())
    return total


def test_ece_matches_loop():
    rng = np.random.default_rng(0)
    p = rng.random(500)
    p[:3] = [0.0, 1.0, 0.5]
    y = (rng.random(500) < p**2).astype(int)
    for n_bins in (5, 10, 15):
        assert expected_calibration_error(y, p, n_bins) == pytest.approx(_ece_loop(y, p, n_bins))
    curve = reliability_curve(y, p, 10)
    assert sum(curve["count"]) == 500


def test_temperature_recovers_known_t():
    rng = np.random.default_rng(0)
    m = rng.normal(0, 4, 20000)
    y = (rng.random(20000) < sigmoid(m / 2.0)).astype(int)
    cal = TemperatureCalibrator().fit(m, y)
    assert cal.temperature_ == pytest.approx(2.0, rel=0.08)
    # from probabilities (uncalibrated model output σ(m)) gives the same T
    cal_p = TemperatureCalibrator(input="probability").fit(sigmoid(m), y)
    assert cal_p.temperature_ == pytest.approx(cal.temperature_, rel=1e-3)
    d = json.loads(json.dumps(cal.to_dict()))
    np.testing.assert_allclose(apply_calibration(d, m[:10]), sigmoid(m[:10] / cal.temperature_))
    np.testing.assert_allclose(TemperatureCalibrator.from_dict(d).transform(m[:10]),
                               cal.transform(m[:10]))


def test_temperature_per_column():
    rng = np.random.default_rng(1)
    m = rng.normal(0, 3, (4000, 2))
    y = (rng.random((4000, 2)) < sigmoid(m / np.array([0.5, 3.0]))).astype(int)
    t = TemperatureCalibrator().fit(m, y).temperature_
    assert t[0] == pytest.approx(0.5, rel=0.15) and t[1] == pytest.approx(3.0, rel=0.15)


def test_platt_recovers_a_shifted_baseline_that_temperature_cannot():
    """Outcomes drawn from σ(0.7·m − 1.2): Platt finds slope and intercept; a temperature map
    (no intercept) is left miscalibrated in the mean, as at a site with fewer events."""
    rng = np.random.default_rng(2)
    m = rng.normal(0, 3, (20000, 2))
    truth = sigmoid(0.7 * m - 1.2)
    y = (rng.random(m.shape) < truth).astype(int)
    platt = PlattCalibrator().fit(m[:, 0], y[:, 0])
    assert platt.slope_ == pytest.approx(0.7, rel=0.05)
    assert platt.intercept_ == pytest.approx(-1.2, abs=0.08)
    d = json.loads(json.dumps(platt.to_dict()))
    np.testing.assert_allclose(apply_calibration(d, m[:10, 0]),
                               sigmoid(platt.slope_ * m[:10, 0] + platt.intercept_))
    temp = TemperatureCalibrator().fit(m[:, 0], y[:, 0])
    assert abs(temp.transform(m[:, 0]).mean() - y[:, 0].mean()) > 0.05
    assert abs(platt.transform(m[:, 0]).mean() - y[:, 0].mean()) < 0.01
    per_col = PlattCalibrator().fit(m, y)  # one pair per column, applied per column
    np.testing.assert_allclose(per_col.transform(m[:10])[:, 1],
                               sigmoid(per_col.slope_[1] * m[:10, 1] + per_col.intercept_[1]))
    p = sigmoid(m[:, 0])  # from probabilities: the same map on logit(p)
    by_p = PlattCalibrator(input="probability").fit(p, y[:, 0])
    assert by_p.slope_ == pytest.approx(platt.slope_, rel=1e-3)


def test_a_falling_platt_map_is_not_monotone_in_the_probability():
    from scehr.schemas.manifest import Calibration

    rising = Calibration(method="platt", input="probability", slope=0.8, intercept=0.1)
    falling = rising.model_copy(update={"slope": -0.8})
    assert rising.monotone_in_probability and not falling.monotone_in_probability
    p = np.array([0.1, 0.5, 0.9])
    assert np.all(np.diff(rising.apply(p, p)) > 0) and np.all(np.diff(falling.apply(p, p)) < 0)


def test_isotonic_roundtrip_equals_sklearn():
    rng = np.random.default_rng(2)
    p = rng.random(400)
    y = (rng.random(400) < p**3).astype(int)
    cal = IsotonicCalibrator(strict=False).fit(p, y)
    d = json.loads(json.dumps(cal.to_dict()))
    x_new = np.concatenate([rng.random(200), [-0.5, 0.0, 1.0, 2.0]])  # incl. out of range
    # The served read-out keeps risks strictly inside (0, 1) (schemas.contract.RISK_EPS).
    expected = np.clip(cal.models_[0].transform(x_new), RISK_EPS, 1 - RISK_EPS)
    np.testing.assert_allclose(apply_calibration(d, x_new), expected)
    np.testing.assert_allclose(
        np.clip(IsotonicCalibrator.from_dict(d).transform(x_new), RISK_EPS, 1 - RISK_EPS),
        expected)
    Y2 = np.stack([y, 1 - y], axis=1)
    P2 = np.stack([p, 1 - p], axis=1)
    cal2 = IsotonicCalibrator(strict=False).fit(P2, Y2)
    out = apply_calibration(cal2.to_dict(), P2[:20])
    np.testing.assert_allclose(out[:, 1], np.clip(cal2.models_[1].transform(P2[:20, 1]),
                                                  RISK_EPS, 1 - RISK_EPS))


def _distinct_scores(rng: np.random.Generator, n: int) -> np.ndarray:
    """Distinct probabilities over [0, 1] at least 1e-9 apart, the ends and crowds near 0
    and 1 included (closer scores cannot get distinct float64 risks from any smooth map)."""
    p = np.r_[rng.random(n), rng.random(n) ** 3, 1 - rng.random(n) ** 3, 0.0, 1.0, 0.5,
              0.5 + 1e-7]
    return np.unique(np.round(p.astype(np.float32).astype(np.float64), 9))


@pytest.mark.parametrize("seed", range(6))
def test_the_isotonic_map_never_ties_distinct_scores(seed: int) -> None:
    """A monotone map must keep the ranking: sklearn's isotonic fit is a step function (every
    score of a step gets one risk, and every score beyond the held-out range the end step's),
    the served map is strictly increasing on all of [0, 1], inside the risk's bounds, and
    still isotonic regression's: its knots are the steps' observed rates."""
    rng = np.random.default_rng(seed)
    n = [30, 126, 400, 2000, 60, 126][seed]
    p = rng.beta(0.5, 6, n) if seed % 2 else rng.random(n)
    y = (rng.random(n) < np.clip(2 * p**1.5, 0, 1)).astype(int)
    y[:2] = [0, 1]  # both outcomes present
    cal = IsotonicCalibrator().fit(p, y)
    x = _distinct_scores(rng, 3000)
    r = cal.transform(x)
    assert np.all(np.diff(r) > 0), "two distinct scores share a risk"
    assert r.min() > RISK_EPS and r.max() < 1 - RISK_EPS  # nothing clipped, so nothing tied
    kx, ky = np.asarray(cal.x_thresholds_), np.asarray(cal.y_thresholds_)
    steps = np.unique(cal.models_[0].predict(np.unique(p)))
    inner = ky[(kx > 0) & (kx < 1)]
    assert len(inner) == len(steps)
    np.testing.assert_allclose(inner[1:-1], RISK_EPS + steps[1:-1] * (1 - 2 * RISK_EPS))
    served = apply_calibration(cal.to_dict(), x)  # the service's read-out of the export
    np.testing.assert_array_equal(served, r)


def test_the_chosen_calibration_keeps_the_ranking_of_every_class() -> None:
    """Export's choice among no map, temperature, Platt and isotonic, on per-class data where
    isotonic wins: the served risk ranks a class's stays as its score does, so per-class AUROC
    is unchanged, and a Platt map whose slope would reverse the ranking is never chosen."""
    from scehr.schemas.manifest import logistic_margin
    from scehr.training.metrics import auroc
    from scehr.training.serving_assets import fit_calibration

    rng = np.random.default_rng(7)

    def split(n: int, flip: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        p = rng.random(n)
        y = (rng.random(n) < (np.where(p > 0.6, 0.9, 0.05))).astype(float)  # a step: isotonic
        if flip:
            y = 1.0 - y
        return y, p, logistic_margin(p, "probability")

    for flip in (False, True):
        cal, val = split(300, flip), split(3000, flip)
        c = fit_calibration(cal, val, "test", logistic_input="probability")
        x = _distinct_scores(rng, 2000)
        r = c.apply(x, logistic_margin(x, "probability"))
        inner = (x > 1e-3) & (x < 1 - 1e-3)  # a sigmoid map may reach the risk's bounds
        assert np.all(np.diff(r[inner]) > 0), (flip, c.method)
        if not flip:
            assert c.method == "isotonic"
        yv, pv, mv = val
        assert auroc(yv, c.apply(pv, mv)) == pytest.approx(auroc(yv, pv), abs=1e-12)


def test_apply_calibration_none():
    np.testing.assert_allclose(apply_calibration(None, [0.2, 0.7]), [0.2, 0.7])
    assert apply_calibration({"method": "none", "input": "margin"}, [0.0])[0] == 0.5
    with pytest.raises(ValueError):
        apply_calibration({"method": "beta"}, [0.1])


def test_operating_points_monotonic_and_targets():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 300)
    p = np.clip(0.3 * y + 0.7 * rng.random(300), 0, 1)
    rows = operating_points(y, p)
    fixed = [r for r in rows if r["target_sensitivity"] is None]
    assert [r["threshold"] for r in fixed] == sorted(r["threshold"] for r in fixed)
    sens = [r["sensitivity"] for r in fixed]
    alerts = [r["alert_rate"] for r in fixed]
    spec = [r["specificity"] for r in fixed]
    assert all(a >= b for a, b in itertools.pairwise(sens))
    assert all(a >= b for a, b in itertools.pairwise(alerts))
    assert all(a <= b for a, b in itertools.pairwise(spec))
    for r in (r for r in rows if r["target_sensitivity"] is not None):
        assert r["sensitivity"] >= r["target_sensitivity"]
        # a slightly higher threshold would miss the target (highest such threshold)
        above = p[y == 1] > r["threshold"]
        assert above.mean() < r["target_sensitivity"]
    json.dumps(rows)


def test_named_points_follow_their_rules_on_validation() -> None:
    from scehr.training.calibration import choose_named_points, point_stats

    rng = np.random.default_rng(0)
    y = (rng.random(2000) < 0.15).astype(int)
    risk = np.clip(0.15 + 0.25 * (y - 0.15) + rng.normal(0, 0.12, 2000), 0.001, 0.999)
    pts = choose_named_points(y, risk)
    assert list(pts) == ["high_sensitivity", "balanced", "high_ppv"]
    hs, bal, hp = (point_stats(y, risk, pts[k][0]) for k in pts)
    assert hs["sensitivity"] >= 0.8 and hp["ppv"] >= 0.5
    # high_sensitivity is the highest threshold reaching 0.8: one step up loses it
    above = np.sort(np.unique(risk))
    nxt = above[np.searchsorted(above, pts["high_sensitivity"][0]) + 1]
    assert point_stats(y, risk, nxt)["sensitivity"] < 0.8
    # balanced maximizes min(Se, PPV) over every threshold
    best = max(min(point_stats(y, risk, t)["sensitivity"], point_stats(y, risk, t)["ppv"] or 0)
               for t in above[::20])
    assert min(bal["sensitivity"], bal["ppv"]) >= best - 1e-12
    assert hs["alert_rate"] > bal["alert_rate"]
    # high_ppv: above balanced, the best PPV among thresholds keeping half of balanced's
    # true positives; no such threshold does better
    tp_bal = bal["sensitivity"] * y.sum()
    keeps = [t for t in above if t > pts["balanced"][0]
             and point_stats(y, risk, t)["sensitivity"] * y.sum() >= max(10, tp_bal / 2) - 1e-9]
    assert pts["high_ppv"][0] in keeps
    assert hp["ppv"] >= max(point_stats(y, risk, t)["ppv"] for t in keeps) - 1e-12
    assert set(hs) == {"n", "sensitivity", "specificity", "ppv", "npv", "alert_rate"}
    # a rule that cannot be met is left out, never approximated
    rare = choose_named_points(np.r_[np.zeros(500), np.ones(3)].astype(int),
                               rng.random(503))
    assert "high_ppv" not in rare


@pytest.mark.parametrize("cls", [TemperatureCalibrator, PlattCalibrator, IsotonicCalibrator])
def test_calibrators_follow_scikit_learns_estimator_conventions(cls, monkeypatch):
    """Parameters in __init__ only, learned state set by fit (trailing `_`), clone and
    get_params, a NotFittedError before fit; transform is numpy (no pydantic object per call)
    and equals the exported map's served read-out."""
    from sklearn.base import clone
    from sklearn.exceptions import NotFittedError
    from sklearn.utils import estimator_checks as checks

    from scehr.schemas.manifest import Calibration

    for check in (checks.check_no_attributes_set_in_init,
                  checks.check_parameters_default_constructible,
                  checks.check_get_params_invariance, checks.check_set_params,
                  checks.check_estimator_cloneable,
                  checks.check_do_not_raise_errors_in_init_or_set_params):
        check(cls.__name__, cls())
    rng = np.random.default_rng(4)
    p = rng.random(300)
    y = (rng.random(300) < p).astype(int)
    cal = cls(input="probability")
    for unfitted in (lambda: cal.transform(p), cal.to_calibration, cal.to_dict):
        with pytest.raises(NotFittedError):
            unfitted()
    assert cal.fit(p, y) is cal
    learned = {k for k in vars(cal) if k.endswith("_")}
    assert set(cls.learned.values()) <= learned and set(vars(cal)) - learned == {
        *cal.get_params()}
    twin = clone(cal)
    assert twin.get_params() == cal.get_params() and not any(k.endswith("_") for k in vars(twin))
    with pytest.raises(ValueError, match="shape mismatch"):
        twin.fit(p, y[:-1])
    exported = cal.to_calibration(fitted_on="validation")
    assert exported.fitted_on == "validation" and exported.method == cls.method
    monkeypatch.setattr(Calibration, "__init__", None)  # any pydantic object built would fail
    np.testing.assert_array_equal(cal.transform(p), exported.apply(p, p))


def test_a_calibrator_fitted_per_column_refuses_other_shapes() -> None:
    rng = np.random.default_rng(5)
    m = rng.normal(0, 2, (200, 3))
    y = (rng.random((200, 3)) < sigmoid(m)).astype(int)
    cal = PlattCalibrator().fit(m, y)
    assert cal.n_columns_ == 3 and cal.transform(m).shape == (200, 3)
    for bad in (m[:, 0], m[:, :2]):
        with pytest.raises(ValueError, match="3 columns"):
            cal.transform(bad)
    with pytest.raises(ValueError, match="3 columns"):
        cal.to_calibration()  # the manifest holds one map per class: fit one per class
    assert PlattCalibrator.from_dict(cal.to_dict()).n_columns_ == 3


def _ordered(y: np.ndarray, risk: np.ndarray) -> None:
    """The named points of (y, risk) rise in threshold and in PPV, in their names' order."""
    from scehr.training.calibration import choose_named_points, point_stats

    pts = choose_named_points(y, risk)
    names = [n for n in ("high_sensitivity", "balanced", "high_ppv") if n in pts]
    t = [pts[n][0] for n in names]
    ppv = [point_stats(y, risk, x)["ppv"] for x in t]
    alerts = [point_stats(y, risk, x)["alert_rate"] for x in t]
    assert t == sorted(t), dict(zip(names, t, strict=True))
    assert ppv == sorted(ppv), dict(zip(names, ppv, strict=True))
    assert alerts == sorted(alerts, reverse=True)


def test_high_ppv_is_above_balanced_where_the_lowest_threshold_at_ppv_half_is_below_it() -> None:
    """A validation set like mortality 1.3.1's: balanced's PPV is above 0.5, so the lowest
    threshold reaching PPV 0.5 lies below balanced and "high PPV" alerted for more stays."""
    from scehr.training.calibration import choose_named_points, point_stats

    # 40 events among 1000 stays; from the top: 30 events then 10 non-events, 4 events then
    # 30 non-events (PPV falls to 0.46 there), 6 events then the rest
    y = np.r_[np.ones(30), np.zeros(10), np.ones(4), np.zeros(30), np.ones(6),
              np.zeros(920)].astype(int)
    risk = np.linspace(0.9, 0.01, y.size)
    pts = choose_named_points(y, risk)
    bal, hp = pts["balanced"][0], pts["high_ppv"][0]
    assert point_stats(y, risk, bal)["ppv"] > 0.5
    # what the former rule chose: the lowest threshold with PPV >= 0.5 and >= 10 events
    former = min(t for t in risk if point_stats(y, risk, t)["ppv"] >= 0.5
                 and point_stats(y, risk, t)["sensitivity"] * 40 >= 10)
    assert former < bal
    assert hp > bal and point_stats(y, risk, hp)["ppv"] > point_stats(y, risk, bal)["ppv"]
    _ordered(y, risk)


def test_high_sensitivity_is_never_above_balanced() -> None:
    """Outcomes the risk separates perfectly: balanced catches every event with PPV 1, so a
    threshold reaching sensitivity 0.8 higher up would be a "high sensitivity" point that
    alerts for fewer patients than balanced."""
    from scehr.training.calibration import choose_named_points

    y = np.r_[np.zeros(80), np.ones(20)].astype(int)
    risk = np.linspace(0.01, 0.99, 100)
    pts = choose_named_points(y, risk)
    assert pts["high_sensitivity"][0] <= pts["balanced"][0]
    _ordered(y, risk)


def test_named_points_are_ordered_on_any_validation_set() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(50, 600))
        y = (rng.random(n) < rng.uniform(0.03, 0.5)).astype(int)
        risk = np.round(np.clip(0.3 * y * rng.uniform(0, 2) + rng.normal(0.2, 0.15, n),
                                1e-4, 1 - 1e-4), int(rng.integers(2, 5)))  # ties too
        _ordered(y, risk)
