"""Fairness audit of a binary risk: discrimination, calibration and alerts by sex and age band,
and how far single predictions move when only the recorded sex is flipped.

Groups come from the stay's static inputs (`scehr.schemas.featureset.STATIC_FIELDS`: age in years,
sex_male 1/0, NaN when unknown). The same audit runs at export (model card) and in
`scehr evaluate` of an exported model on another site's data, on the risk the service shows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from scehr.schemas.featureset import STATIC_FIELDS
from scehr.schemas.manifest import ClassCard
from scehr.training.metrics import auroc

AGE, SEX = STATIC_FIELDS.index("age"), STATIC_FIELDS.index("sex_male")
#: (name, lowest age included, first age excluded); None is open-ended.
AGE_BANDS: tuple[tuple[str, float | None, float | None], ...] = (
    ("age<50", None, 50), ("age 50-69", 50, 70), ("age 70-79", 70, 80), ("age>=80", 80, None))
#: |Δrisk| above which a sex flip counts as a material change of a single prediction.
MATERIAL = 0.05
_EPS = 1e-6


def groups(static_raw: np.ndarray) -> dict[str, np.ndarray]:
    """Boolean masks: everyone, each recorded sex, each age band (unknown values in none)."""
    raw = np.asarray(static_raw, dtype=np.float64)
    age, male = raw[:, AGE], raw[:, SEX]
    out = {"all": np.ones(len(raw), dtype=bool), "sex=female": male == 0, "sex=male": male == 1}
    for name, lo, hi in AGE_BANDS:
        out[name] = ((age >= lo) if lo is not None else np.isfinite(age)) & (
            (age < hi) if hi is not None else np.isfinite(age))
    return out


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


#: Stays of each outcome a calibration slope or intercept needs: with fewer, a handful of stays
#: (or their separation by the risk) decides the logistic fit, and its number means nothing.
MIN_CALIBRATION_EVENTS = 10
#: The largest |slope| or |intercept| reported. The served risk is clipped to [1e-4, 1 - 1e-4]
#: (logit within ±9.2), so a coefficient beyond 10 is a fit running off to infinity (the risk
#: separates the outcomes, or nearly), not a calibration.
MAX_LOGIT_COEFFICIENT = 10.0


@dataclasses.dataclass(frozen=True)
class CalibrationFit:
    """Calibration slope and intercept, NaN where they cannot be estimated, with the reason."""

    slope: float
    intercept: float
    slope_warning: str | None = None
    intercept_warning: str | None = None


def _nll(design: np.ndarray, beta: np.ndarray, y: np.ndarray, offset: np.ndarray) -> float:
    z = design @ beta + offset
    return float(np.sum(np.logaddexp(0.0, z) - y * z))


def _logistic_fit(x: np.ndarray, y: np.ndarray, offset: np.ndarray, with_slope: bool
                  ) -> tuple[np.ndarray, bool]:
    """Unpenalised maximum-likelihood (a[, b]) of logit P(y=1) = a [+ b·x] + offset, and
    whether it converged.

    Newton's method with step halving (a step never lowers the likelihood): plain Newton from 0
    overshoots when the intercept is far from 0 and runs off to ±1e9. Written out rather than
    scikit-learn's solver: the bootstrap refits it thousands of times."""
    design = np.column_stack([np.ones_like(x), x]) if with_slope else np.ones((len(x), 1))
    beta = np.zeros(design.shape[1])
    loss = _nll(design, beta, y, offset)
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ beta + offset, -35, 35)))
        w = p * (1 - p)
        hess = design.T @ (design * w[:, None]) + 1e-9 * np.eye(len(beta))
        step = np.linalg.solve(hess, design.T @ (y - p))
        t = 1.0
        while t > 1e-6 and _nll(design, beta + t * step, y, offset) > loss + 1e-12:
            t /= 2
        beta = beta + t * step
        loss = _nll(design, beta, y, offset)
        if np.max(np.abs(t * step)) < 1e-9:
            return beta, True
    return beta, False


def _too_few(y: np.ndarray) -> str | None:
    events = int(y.sum())
    others = len(y) - events
    if min(events, others) >= MIN_CALIBRATION_EVENTS:
        return None
    return (f"cannot be estimated: {events} stays with the outcome and {others} without; a "
            f"logistic calibration fit needs at least {MIN_CALIBRATION_EVENTS} of each")


def _runaway(value: float, converged: bool) -> str | None:
    if not converged:
        return ("cannot be estimated: the logistic fit does not converge (the risk separates "
                "the outcomes, or nearly)")
    if abs(value) > MAX_LOGIT_COEFFICIENT:
        return (f"cannot be estimated: the logistic fit runs off to {value:.3g}, beyond "
                f"±{MAX_LOGIT_COEFFICIENT:g} (the risk separates the outcomes, or nearly)")
    return None


def calibration_fit(y: np.ndarray, risk: np.ndarray) -> CalibrationFit:
    """(slope, intercept) of the logistic recalibration of `risk` (Cox 1958; Van Calster 2019),
    each NaN with a warning where it cannot be estimated: fewer than MIN_CALIBRATION_EVENTS
    stays of either outcome, a fit that does not converge, or one beyond MAX_LOGIT_COEFFICIENT.

    Slope: b in logit P(y=1) = a + b·logit(risk) (1 is ideal; < 1 means too extreme risks).
    Intercept: calibration-in-the-large, a in logit P(y=1) = a + logit(risk) with the slope
    fixed at 1 (0 is ideal; > 0 means the risk underestimates).
    """
    yy = np.asarray(y, dtype=np.float64).ravel()
    lg = _logit(risk).ravel()
    why = _too_few(yy)
    if why is not None:
        return CalibrationFit(float("nan"), float("nan"), why, why)
    (_, slope), ok_s = _logistic_fit(lg, yy, np.zeros_like(lg), with_slope=True)
    (intercept,), ok_i = _logistic_fit(lg, yy, lg, with_slope=False)
    ws, wi = _runaway(float(slope), ok_s), _runaway(float(intercept), ok_i)
    return CalibrationFit(float("nan") if ws else float(slope),
                          float("nan") if wi else float(intercept), ws, wi)


def calibration_slope_intercept(y: np.ndarray, risk: np.ndarray) -> tuple[float, float]:
    """`calibration_fit`'s (slope, intercept), NaN where it cannot be estimated."""
    fit = calibration_fit(y, risk)
    return fit.slope, fit.intercept


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def group_table(y: np.ndarray, risk: np.ndarray, alerts: np.ndarray, static_raw: np.ndarray
                ) -> dict[str, dict[str, Any]]:
    """Per group: stays, deaths, AUROC, calibration slope/intercept, alert rate (None where a
    figure is undefined, e.g. a group with one outcome)."""
    yy, rr = np.asarray(y).ravel(), np.asarray(risk).ravel()
    aa = np.asarray(alerts, dtype=bool).ravel()
    out: dict[str, dict[str, Any]] = {}
    for name, m in groups(static_raw).items():
        both = m.sum() > 1 and 0 < yy[m].sum() < m.sum()
        slope, intercept = calibration_slope_intercept(yy[m], rr[m]) if both else (
            float("nan"), float("nan"))
        out[name] = {
            "n": int(m.sum()), "deaths": int(yy[m].sum()),
            "auroc": float(auroc(yy[m], rr[m])) if both else None,
            "calibration_slope": _finite(slope), "calibration_intercept": _finite(intercept),
            "alert_rate": float(aa[m].mean()) if m.any() else None,
        }
    return out


def sex_flip(risk: np.ndarray, flipped: np.ndarray, alerts: np.ndarray,
             flipped_alerts: np.ndarray, static_raw: np.ndarray) -> dict[str, Any]:
    """Distribution of |Δrisk| when only the recorded sex is flipped (stays with a known sex)."""
    known = np.isin(np.asarray(static_raw, dtype=np.float64)[:, SEX], (0.0, 1.0))
    d = np.abs(np.asarray(flipped, dtype=np.float64) - np.asarray(risk, dtype=np.float64))[known]
    changed = (np.asarray(alerts, dtype=bool) != np.asarray(flipped_alerts, dtype=bool))[known]
    if not len(d):
        return {"n": 0}
    q = np.quantile(d, [0.5, 0.9, 0.99])
    return {"n": len(d), "median": float(q[0]), "p90": float(q[1]), "p99": float(q[2]),
            "max": float(d.max()), "mean": float(d.mean()),
            f"share_above_{MATERIAL:g}": float((d > MATERIAL).mean()),
            "alerts_changed": int(changed.sum()), "alerts_changed_share": float(changed.mean())}


def flip_sex(static_raw: np.ndarray) -> np.ndarray:
    """The static inputs with sex_male 1 ↔ 0 (unknown stays unknown)."""
    out = np.array(static_raw, dtype=np.float64, copy=True)
    out[:, SEX] = np.where(np.isnan(out[:, SEX]), np.nan, 1.0 - out[:, SEX])
    return out


def audit(y: np.ndarray, risk: np.ndarray, alerts: np.ndarray, static_raw: np.ndarray,
          flipped_risk: np.ndarray, flipped_alerts: np.ndarray, *, where: str,
          alert_rule: str) -> dict[str, Any]:
    """The whole audit as the manifest stores it (`metrics["fairness"]`)."""
    return {"data": where, "alert_rule": alert_rule,
            "groups": group_table(y, risk, alerts, static_raw),
            "sex_flip": sex_flip(risk, flipped_risk, alerts, flipped_alerts, static_raw)}


def _f(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def audit_lines(a: dict[str, Any]) -> list[str]:
    """The model card's section: the group table, the sex-flip distribution and what it means."""
    lines = ["", "## Fairness audit", "",
             f"On {a['data']}, on the risk the service shows. Alerts: {a['alert_rule']}. "
             "Calibration slope 1 and intercept 0 are ideal (slope < 1: risks too extreme; "
             "intercept > 0: risks too low for the group). Sex and age from the stay's "
             "demographics; stays with an unknown value fall in no group of that kind.", "",
             "| group | stays | deaths | AUROC | calibration slope | calibration intercept | "
             "alert rate |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in a["groups"].items():
        lines.append(f"| {name} | {r['n']} | {r['deaths']} | {_f(r['auroc'])} | "
                     f"{_f(r['calibration_slope'], 2)} | {_f(r['calibration_intercept'], 2)} | "
                     f"{_f(r['alert_rate'])} |")
    s = a["sex_flip"]
    if not s.get("n"):
        return [*lines, "", "No stay has a recorded sex: the sex-flip test was not run."]
    share = s[f"share_above_{MATERIAL:g}"]
    lines += ["", "### Sensitivity to the sex field", "",
              f"Each of {s['n']} stays with a recorded sex scored again with only the sex "
              "flipped: |Δrisk| median "
              f"{s['median']:.4f}, 90th percentile {s['p90']:.4f}, 99th {s['p99']:.4f}, "
              f"max {s['max']:.4f}; {share:.1%} of stays move by more than {MATERIAL:g}; "
              f"{s['alerts_changed']} alerts ({s['alerts_changed_share']:.1%} of stays) change.",
              ""]
    if s["max"] == 0:
        lines.append("The model does not read sex: flipping it changes no prediction.")
    else:
        lines.append(
            "What it means: the model uses the recorded sex as a predictor, so two patients "
            "with identical measurements but a different sex field get different risks. A "
            "wrong or missing sex in the record moves an individual's risk by about this much; "
            "whether a sex-dependent risk is wanted is a clinical decision for the deploying "
            "site, and group AUROC or calibration alone does not show it.")
    return lines


def subgroup_auroc(y: np.ndarray, p: np.ndarray, static_raw: np.ndarray) -> dict[str, Any]:
    """Test AUROC by sex and age band (the fairness audit's groups), with counts; None where
    undefined."""
    out = {}
    for name, m in groups(static_raw).items():
        if name == "all":
            continue
        a = auroc(y[m], p[m]) if m.sum() > 1 else float("nan")
        out[name] = {"n": int(m.sum()), "positives": int(y[m].sum()),
                     "auroc": None if np.isnan(a) else float(a)}
    return out


def fairness_at_export(model: Any, crit: Any, data: Any, preds: dict[str, np.ndarray],
                       card: ClassCard) -> dict[str, Any] | None:
    """The fairness audit of a binary model on its test split (training.fairness).

    Alerts are the risk at or above the default named operating point. The sex flip re-scores
    the test stays, so it needs the run's data folder (`data`, from `scehr.training.fit.prepare`);
    None when that is gone or no operating point was reachable.
    """
    import torch

    from scehr.training.fit import predict

    point = {p.name: p for p in card.named_points}.get(card.default_operating_point or "")
    if data is None or point is None:
        return None
    test = data.test
    if list(test.stays) != [str(s) for s in preds["test_stays"]]:
        raise ValueError("the run's data folder no longer holds the test stays it was "
                         "trained with: cannot audit the model on them")
    raw = preds["test_static_raw"]

    def risk(split: Any) -> np.ndarray:
        out = predict(model, crit, split)
        lg = out["anchor_logits"][:, 0]
        return card.calibration.apply(out["probability"][:, 0], lg[:, 0] - lg[:, 1])

    flipped_static = torch.from_numpy(data.static_imputer.transform(flip_sex(raw)))
    r = risk(test)
    rf = risk(dataclasses.replace(test, static=flipped_static))
    t = point.threshold
    return audit(preds["test_y"][:, 0], r, r >= t, raw, rf, rf >= t,
                          where=f"the test split ({len(r)} stays)",
                          alert_rule=f"risk >= {t:.4f} (operating point `{point.name}`, "
                          "chosen on validation)")
