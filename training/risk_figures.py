"""The discrimination and calibration figures of a risk on a site's stays, one list for
`scehr evaluate` (`scehr.training.site_report`) and the figures `scehr recalibrate` writes
(`scehr.training.external`): AUROC, AUPRC, ECE, calibration slope and intercept (NaN where
they cannot be estimated: `scehr.training.fairness.calibration_fit`) and the Challenge 2012
scores; `risk_figures` gives them with bootstrap CIs and a warning, not a number, where a
slope or intercept cannot be estimated."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from scehr.training import fairness
from scehr.training.bootstrap import bootstrap_ci
from scehr.training.calibration import expected_calibration_error
from scehr.training.challenge2012 import event1_threshold, hosmer_lemeshow
from scehr.training.metrics import auprc, auroc


def calibration_slope(y: np.ndarray, r: np.ndarray) -> float:
    return fairness.calibration_slope_intercept(y, r)[0]


def calibration_intercept(y: np.ndarray, r: np.ndarray) -> float:
    return fairness.calibration_slope_intercept(y, r)[1]


def _event1_best(y: np.ndarray, r: np.ndarray) -> float:
    return event1_threshold(y, r)[1] if y.min() != y.max() else float("nan")


def _plain_h(y: np.ndarray, r: np.ndarray) -> float:
    return hosmer_lemeshow(y, r, normalized=False)


Metric = Callable[[np.ndarray, np.ndarray], float]
#: A CI resting on fewer valid resamples than this share of them gets a note.
MIN_VALID_SHARE = 0.95

RISK_METRICS: dict[str, Metric] = {
    "auroc": auroc, "auprc": auprc, "ece": expected_calibration_error,
    "calibration_slope": calibration_slope, "calibration_intercept": calibration_intercept,
    "event1_best_threshold": _event1_best, "event2_h_normalized": hosmer_lemeshow,
    "event2_h": _plain_h,
}


def figure_ci(fn: Metric, y: np.ndarray, v: np.ndarray, n_boot: int, seed: int
              ) -> dict[str, Any]:
    """`bootstrap_ci` with a note when too few resamples could be evaluated."""
    ci = bootstrap_ci(fn, y, np.asarray(v, dtype=np.float64), n_boot=n_boot, seed=seed)
    if ci["value"] is not None and ci["n_valid"] < MIN_VALID_SHARE * n_boot:
        ci["note"] = (f"only {ci['n_valid']} of {n_boot} resamples could be evaluated (the "
                      "others had too few events or separated outcomes): a rough interval")
    return ci


def _not_estimable(warning: str, n_boot: int) -> dict[str, Any]:
    return {"value": None, "low": None, "high": None, "n_boot": n_boot, "n_valid": 0,
            "warning": warning}


def risk_figures(y: np.ndarray, risk: np.ndarray, n_boot: int, seed: int) -> dict[str, Any]:
    """Discrimination and calibration of `risk` with CIs; a calibration slope or intercept
    that cannot be estimated carries a `warning` and no value."""
    out: dict[str, Any] = {"n": len(y), "events": int(y.sum()),
                           "mean_risk": float(risk.mean()) if len(y) else None,
                           "observed_rate": float(y.mean()) if len(y) else None}
    if not len(y):
        return out
    fit = fairness.calibration_fit(y, risk)
    warnings = {"calibration_slope": fit.slope_warning,
                "calibration_intercept": fit.intercept_warning}
    for name, fn in RISK_METRICS.items():
        why = warnings.get(name)
        out[name] = _not_estimable(why, n_boot) if why else figure_ci(fn, y, risk, n_boot, seed)
    return out
