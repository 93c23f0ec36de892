"""What a served model needs beside its graph, per class, fitted at export: the calibration
map, the operating points, the nearest-prototype centres and the margin reference.

All of it is chosen on the run's held-out splits (calibration, validation), never on test; the
manifest carries it (schemas/manifest.py) and the service reads it without training code.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from scehr.schemas.contract import RISK_EPS
from scehr.schemas.manifest import (
    SERVED_RISK,
    Calibration,
    MarginReference,
    NamedOperatingPoint,
    OperatingPoint,
    PointStats,
)
from scehr.training.calibration import (
    IsotonicCalibrator,
    PlattCalibrator,
    TemperatureCalibrator,
    brier,
    choose_named_points,
    expected_calibration_error,
    operating_points,
    point_stats,
)

MIN_PROTOTYPE = 20


def prototypes(z: np.ndarray, y: np.ndarray, seed: int = 0, k_max: int = 4) -> list[dict]:
    """Class-conditional k-means centres of training embeddings, with what they stand for.

    Centres are fitted within each outcome (k <= k_max); every training stay is then assigned
    to its nearest centre by cosine similarity, as the service does at request time, giving each
    prototype a count and an observed outcome rate. A prototype nearest to fewer than 20 stays
    is dropped (and its stays reassigned), so no prototype can stand for one patient.
    """
    from sklearn.cluster import KMeans

    centres: list[tuple[int, np.ndarray]] = []
    for label in (0, 1):
        zs = z[y == label]
        k = min(k_max, len(zs) // (2 * MIN_PROTOTYPE))
        if k >= 1:
            km = KMeans(n_clusters=k, n_init=4, random_state=seed).fit(zs)
            # 5 decimals keep manifests small; counts below use the rounded centres.
            centres += [(label, np.round(c, 5)) for c in km.cluster_centers_]
    zn = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    while centres:
        c = np.stack([v for _, v in centres])
        cn = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
        nearest = (zn @ cn.T).argmax(axis=1)
        counts = np.bincount(nearest, minlength=len(centres))
        if counts.min() >= MIN_PROTOTYPE:
            return [{"label": lab, "centroid": v.tolist(), "count": int(counts[i]),
                     "outcome_rate": float(y[nearest == i].mean())}
                    for i, (lab, v) in enumerate(centres)]
        centres.pop(int(counts.argmin()))
    return []


NO_HOLDOUT = ("not calibrated: the run has no calibration split held out of training and "
              "early stopping (calibration_fraction = 0 or too few stays)")


def fit_calibration(cal: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
                    val: tuple[np.ndarray, np.ndarray, np.ndarray], where: str,
                    logistic_input: Literal["margin", "probability"] = "margin"
                    ) -> Calibration:
    """Fit temperature, Platt and isotonic maps on `cal`; keep the best of them and none on
    `val`. Only maps that keep the ranking of the held-out scores compete (`keeps_ranking`; the
    isotonic map is the strict one, always kept), so the served risk has the score's AUROC
    per class.

    Each triple is (y, p, margin). The choice and the reported ECE use the validation split,
    which the maps never saw, so neither number is an in-sample figure. With no held-out `cal`
    (None) nothing is fitted: validation chose the epoch, so it cannot also fit the map and
    measure its effect. The temperature map is σ(m / T) and the Platt map σ(a·m + b), m the
    margin, or logit(p) with `logistic_input="probability"`; the isotonic map interpolates p.
    """
    yv, pv, mv = val
    before = expected_calibration_error(yv, pv)
    if cal is None:
        return Calibration(method="none", fitted_on=NO_HOLDOUT, ece_before=before,
                           ece_after=before)
    if len(np.unique(cal[0])) < 2:
        return Calibration(method="none", fitted_on=where, ece_before=before, ece_after=before)
    candidates = calibration_candidates(cal, where, logistic_input)
    held_p, held_m = np.r_[cal[1], pv], np.r_[cal[2], mv]
    candidates = [c for c in candidates if keeps_ranking(c, held_p, held_m)]
    scored = [(brier(yv, c.apply(pv, mv)), i) for i, c in enumerate(candidates)]
    best = candidates[min(scored)[1]]
    return best.model_copy(update={
        "ece_before": before, "ece_after": expected_calibration_error(yv, best.apply(pv, mv))})


def calibration_candidates(cal: tuple[np.ndarray, np.ndarray, np.ndarray], where: str,
                           logistic_input: Literal["margin", "probability"] = "margin"
                           ) -> list[Calibration]:
    """No map, then the temperature, Platt and isotonic maps fitted on `cal` (y, p, margin):
    the candidates, in order of preference on a tie. Both outcomes must occur in `cal`."""
    yc, pc, mc = cal
    x = mc if logistic_input == "margin" else pc  # what the two logistic maps read
    maps = (TemperatureCalibrator(input=logistic_input).fit(x, yc),
            PlattCalibrator(input=logistic_input).fit(x, yc), IsotonicCalibrator().fit(pc, yc))
    return [Calibration(method="none", fitted_on=f"{where}; no map beat the model's own "
                        "probability (validation Brier)"),
            *(m.to_calibration(fitted_on=where) for m in maps)]


def keeps_ranking(cal: Calibration, p: np.ndarray, margin: np.ndarray) -> bool:
    """Whether a map gives the held-out stays' distinct scores (`p`, `margin`) distinct risks in
    the same order: a Platt slope at or below zero would flatten or reverse the ranking, and a
    map that sends a held-out score to the risk's bounds (RISK_EPS, 1 - RISK_EPS), where the
    served risk is clipped, ties every score beyond it. The strict isotonic map never does."""
    if cal.method == "platt" and float(cal.slope or 0.0) <= 0.0:
        return False
    r = cal.apply(p, margin)
    return bool(np.all((r > RISK_EPS) & (r < 1.0 - RISK_EPS)))


def threshold_points(y: np.ndarray, p: np.ndarray,
            policy: str) -> tuple[list[OperatingPoint], float]:
    """The operating points on validation; the default threshold is the `policy` point's."""
    rows = operating_points(y, p, thresholds=[0.1, 0.2, 0.3, 0.5])
    pts = []
    for r in rows:
        if r.get("sensitivity") is None:
            continue
        name = (f"sensitivity>={r['target_sensitivity']:g}" if r.get("target_sensitivity")
                else f"threshold={r['threshold']:g}")
        pts.append(OperatingPoint(threshold=float(r["threshold"]),
                                  sensitivity=float(r["sensitivity"]),
                                  ppv=float(r["ppv"] or 0.0),
                                  specificity=float(r["specificity"] or 0.0),
                                  alert_rate=float(r["alert_rate"]), name=name))
    target = [o for o in pts if o.name == policy]
    return pts, (target[0].threshold if target else 0.5)


def named_points(val: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray] | None
                 ) -> list[NamedOperatingPoint]:
    """Operating points on the risk, chosen on validation (y, risk); test figures beside."""
    yv, rv = val
    out = []
    for name, (t, rule) in choose_named_points(yv, rv).items():
        out.append(NamedOperatingPoint(
            name=name, rule=rule, threshold=t, validation=PointStats(**point_stats(yv, rv, t)),
            test=None if test is None else PointStats(**point_stats(test[0], test[1], t))))
    return out


#: Stays of one outcome needed before its margin percentiles are stored.
MIN_REFERENCE = 20
PERCENTILES = list(range(1, 100))


def margin_reference(y: np.ndarray, margin: np.ndarray, split: str) -> MarginReference:
    """Margin percentiles 1..99 per outcome (None for an outcome with < MIN_REFERENCE stays)."""
    def q(m: np.ndarray) -> list[float] | None:
        return (np.round(np.percentile(m, PERCENTILES), 5).tolist()
                if len(m) >= MIN_REFERENCE else None)
    neg, pos = margin[y < 0.5], margin[y >= 0.5]
    return MarginReference(split=split, percentiles=[float(p) for p in PERCENTILES],
                           without_outcome=q(neg), with_outcome=q(pos),
                           n_without=len(neg), n_with=len(pos))


#: The point used when a request names none: the same rule as contract 1.0's single threshold
#: (sensitivity >= 0.8), now on the risk; a request picks another by name.
DEFAULT_POINT = "high_sensitivity"


def default_point(named: list[NamedOperatingPoint]) -> str | None:
    names = [p.name for p in named]
    return DEFAULT_POINT if DEFAULT_POINT in names else (names[0] if names else None)


#: Per split, (y, values): outcomes and the risk (or score) of each stay, [N, C] each.
SplitValues = dict[str, tuple[np.ndarray, np.ndarray]]


def metric_block(task: str, labels: list[str], values: SplitValues, n_boot: int,
                 seed: int = 0) -> dict[str, Any]:
    """`test`, `test_ci` (bootstrap) and `val` figures of `values` on those splits."""
    from scehr.training.bootstrap import bootstrap_metrics
    from scehr.training.metrics import task_metrics

    yt, vt = values["test"]
    return {"test": task_metrics(task, yt, vt, labels),
            "test_ci": bootstrap_metrics(task, yt, vt, n_boot=n_boot, seed=seed),
            "val": task_metrics(task, *values["val"], labels)}


def served_metrics(task: str, labels: list[str], risk: SplitValues,
                   score: dict[str, Any], n_boot: int, seed: int = 0) -> dict[str, Any]:
    """The card's and index's figures on the served risk, the score's (`metric_block` of the
    uncalibrated probability) beside them under `score`."""
    return {**metric_block(task, labels, risk, n_boot, seed), "computed_on": SERVED_RISK,
            "score": score}
