"""Calibration: ECE, reliability curves, post-hoc calibration maps, operating points.

Calibration maps are scikit-learn-style estimators fitted on held-out (validation)
predictions and exported as the manifest's `Calibration` (`to_calibration`), which the service
reads out with `scehr.schemas.manifest.calibrated_risk` (numpy only, no sklearn or scipy); their
`transform` is that same read-out, and `apply_calibration` applies an exported dict. Inputs may
be 1-D (one task) or 2-D [N, C] (one map per column, e.g. the 25 phenotypes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal, Self

import numpy as np
from numpy.typing import ArrayLike
from sklearn.base import BaseEstimator
from sklearn.isotonic import IsotonicRegression
from sklearn.metrics import brier_score_loss
from sklearn.utils.validation import check_is_fitted

from scehr.schemas.contract import RISK_EPS
from scehr.schemas.manifest import Calibration, calibrated_risk, logistic_margin, sigmoid

InputKind = Literal["margin", "probability"]


# ---------------------------------------------------------------- pure numpy helpers
def apply_calibration(d: dict[str, Any] | None, margin_or_p: ArrayLike) -> np.ndarray:
    """Apply an exported calibration dict to 1-D inputs or per column of [N, C] inputs.

    A thin adapter over `scehr.schemas.manifest.Calibration.apply`, the one calibration read-out
    (the service serves it; this only splits per-column maps). `margin_or_p` must be what the
    map was fitted on (`d["input"]`). None or method "none" returns probabilities unchanged
    (sigmoid of a margin).
    """
    x = np.asarray(margin_or_p, dtype=np.float64)
    d = d or {"method": "none", "input": "probability"}
    kind = d.get("input", "margin")
    p = x if kind == "probability" else sigmoid(x)

    def one(c: int | None) -> Calibration:
        """The map of column c (None: the only one); a scalar parameter is shared by columns."""
        params = {k: d.get(k) for k in ("temperature", "slope", "intercept", "x", "y")}
        if c is not None:  # per-column maps hold a list per parameter (knots: a list each)
            params = {k: v[c] if isinstance(v, list) else v for k, v in params.items()}
        return Calibration(method=d["method"], input=kind, **params)

    if x.ndim == 1:
        return one(None).apply(p, x)
    return np.stack([one(c).apply(p[:, c], x[:, c]) for c in range(x.shape[1])], axis=1)


# ---------------------------------------------------------------- measures
def _bin_index(p: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-width bins [lo, hi) on [0, 1]; the last bin also holds p == 1."""
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    return np.clip(np.searchsorted(edges, p, side="right") - 1, 0, n_bins - 1)


def reliability_curve(y: ArrayLike, p: ArrayLike, n_bins: int = 10) -> dict[str, list]:
    """Per non-empty bin: edges, mean predicted probability, observed rate and count."""
    yy = np.asarray(y, dtype=np.float64).ravel()
    pp = np.asarray(p, dtype=np.float64).ravel()
    idx = _bin_index(pp, n_bins)
    count = np.bincount(idx, minlength=n_bins)
    sum_p = np.bincount(idx, weights=pp, minlength=n_bins)
    sum_y = np.bincount(idx, weights=yy, minlength=n_bins)
    keep = count > 0
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    return {
        "bin_lower": edges[:-1][keep].tolist(),
        "bin_upper": edges[1:][keep].tolist(),
        "mean_predicted": (sum_p[keep] / count[keep]).tolist(),
        "observed_rate": (sum_y[keep] / count[keep]).tolist(),
        "count": count[keep].astype(int).tolist(),
    }


def expected_calibration_error(y: ArrayLike, p: ArrayLike, n_bins: int = 10) -> float:
    """ECE = Σ_b (n_b / N) |observed_b − predicted_b| over equal-width bins."""
    curve = reliability_curve(y, p, n_bins)
    n = np.asarray(curve["count"], dtype=np.float64)
    if n.sum() == 0:
        return float("nan")
    gap = np.abs(np.asarray(curve["observed_rate"]) - np.asarray(curve["mean_predicted"]))
    return float(np.sum(n * gap) / n.sum())


def brier(y: ArrayLike, p: ArrayLike) -> float:
    """Brier score (mean squared error of the probability)."""
    return float(brier_score_loss(np.asarray(y).ravel(), np.asarray(p, dtype=float).ravel()))


# ---------------------------------------------------------------- calibration maps
def _nll(m: np.ndarray, y: np.ndarray, t: float) -> float:
    """Mean binary NLL of σ(m / t), in log-sigmoid form."""
    s = m / t
    return float(np.mean(y * np.logaddexp(0.0, -s) + (1.0 - y) * np.logaddexp(0.0, s)))


def check_calibration_data(X: ArrayLike, y: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """X and y as float arrays of one shape, 1-D (one map) or [N, C] (one map per column)."""
    x = np.asarray(X, dtype=np.float64)
    yy = np.asarray(y, dtype=np.float64)
    if x.shape != yy.shape:
        raise ValueError(f"shape mismatch: inputs {x.shape} vs labels {yy.shape}")
    if x.ndim not in (1, 2) or len(x) == 0:
        raise ValueError(f"calibration inputs must be 1-D or [N, C] with N >= 1, got {x.shape}")
    return x, yy


class _Calibrator(BaseEstimator):
    """A post-hoc calibration map, with scikit-learn's estimator conventions.

    `__init__` takes the parameters only; `fit(X, y)` learns the map (attributes ending in
    `_`); `transform(X)` gives the risk as the service computes it (`calibrated_risk`);
    `to_calibration` exports a fitted map as the manifest's `Calibration`, `to_dict` as JSON.
    X is what the map reads (the margin or the probability, per `input`), 1-D for one map or
    [N, C] for one map per column; y holds the 0/1 outcomes, in the same shape.
    """

    #: The map's `Calibration.method`.
    method: ClassVar[str]
    #: Exported parameter name (a field of `Calibration`) -> the learned attribute holding it:
    #: the map's value when fitted on 1-D inputs, else a list of them, one per column.
    learned: ClassVar[dict[str, str]]
    #: Whether one map's parameter is itself a list (knots), not a number.
    list_params: ClassVar[bool] = False
    input: InputKind

    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        x, yy = check_calibration_data(X, y)
        cols = [(x, yy)] if x.ndim == 1 else [(x[:, c], yy[:, c]) for c in range(x.shape[1])]
        fits = [self._fit_column(xc, yc) for xc, yc in cols]
        for name, attr in self.learned.items():
            values = [f[name] for f in fits]
            setattr(self, attr, values[0] if x.ndim == 1 else values)
        self.n_columns_: int | None = None if x.ndim == 1 else x.shape[1]
        return self

    def _fit_column(self, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
        """The exported parameters of one column's map."""
        raise NotImplementedError

    def _params(self, c: int | None) -> dict[str, Any]:
        """Column c's parameters (None: the map fitted on 1-D inputs, shared by columns)."""
        check_is_fitted(self)
        if c is None and self.n_columns_ is not None:
            raise ValueError(f"{type(self).__name__} was fitted on {self.n_columns_} columns (a "
                             "map each): apply it to [N, C] inputs; export one map per fit")
        return {name: getattr(self, attr) if c is None else getattr(self, attr)[c]
                for name, attr in self.learned.items()}

    def _column(self, x: np.ndarray, c: int | None) -> np.ndarray:
        p = self._params(c)
        knots = (np.asarray(p["x"]), np.asarray(p["y"])) if "x" in p else None
        return calibrated_risk(self.method, self.input, x, temperature=p.get("temperature"),
                               slope=p.get("slope"), intercept=p.get("intercept"), knots=knots)

    def transform(self, X: ArrayLike) -> np.ndarray:
        """The calibrated risk of X (the shape it was fitted on), strictly in (0, 1)."""
        check_is_fitted(self)
        x = np.asarray(X, dtype=np.float64)
        if x.ndim == 1 or self.n_columns_ is None:
            return self._column(x, None)
        if x.ndim != 2 or x.shape[1] != self.n_columns_:
            raise ValueError(f"{type(self).__name__} was fitted on {self.n_columns_} columns; "
                             f"got inputs of shape {x.shape}")
        return np.stack([self._column(x[:, c], c) for c in range(x.shape[1])], axis=1)

    def to_calibration(self, fitted_on: str = "") -> Calibration:
        """The fitted map as the manifest holds it (one map: fitted on 1-D inputs)."""
        return Calibration(method=self.method, input=self.input, **self._params(None),
                           fitted_on=fitted_on)

    def to_dict(self) -> dict[str, Any]:
        """The fitted map(s) as JSON: per-column maps hold a list per parameter."""
        check_is_fitted(self)
        return {"method": self.method, "input": self.input,
                **{name: getattr(self, attr) for name, attr in self.learned.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        """A fitted calibrator from `to_dict`'s output."""
        obj = cls(input=d.get("input", cls().input))
        for name, attr in cls.learned.items():
            setattr(obj, attr, d[name])
        first = d[next(iter(cls.learned))]
        per_column = isinstance(first, list) and (not cls.list_params
                                                  or isinstance(first[0], list))
        obj.n_columns_ = len(first) if per_column else None
        return obj


def _fit_temperature(m: np.ndarray, y: np.ndarray, bounds: tuple[float, float]) -> float:
    """1-D bounded search over log T (NLL is smooth and unimodal enough in log T)."""
    from scipy.optimize import minimize_scalar

    lo, hi = math.log(bounds[0]), math.log(bounds[1])
    res = minimize_scalar(
        lambda lt: _nll(m, y, math.exp(lt)), bounds=(lo, hi), method="bounded",
        options={"xatol": 1e-6},
    )
    return float(math.exp(res.x))


class TemperatureCalibrator(_Calibrator):
    """p_cal = σ(m / T), T fitted by NLL on held-out data (one T per column if 2-D).

    Temperature scaling keeps the ranking (AUROC unchanged) and only fixes
    over/under-confidence, so it is the safe default for small validation sets.
    """

    method = "temperature"
    learned: ClassVar[dict[str, str]] = {"temperature": "temperature_"}

    def __init__(self, input: InputKind = "margin", bounds: tuple[float, float] = (0.01, 100.0)):
        self.input = input
        self.bounds = bounds

    def _fit_column(self, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
        return {"temperature": _fit_temperature(logistic_margin(x, self.input), y,
                                                self.bounds)}


class PlattCalibrator(_Calibrator):
    """p_cal = σ(a·m + b) (Platt scaling), fitted by unpenalised logistic regression on
    held-out data (one pair per column if 2-D).

    Two parameters instead of temperature's one: the intercept moves the baseline risk, which
    a temperature cannot (e.g. a site whose outcome rate differs from training's).
    """

    method = "platt"
    learned: ClassVar[dict[str, str]] = {"slope": "slope_", "intercept": "intercept_"}

    def __init__(self, input: InputKind = "margin"):
        self.input = input

    def _fit_column(self, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
        from sklearn.linear_model import LogisticRegression

        m = logistic_margin(x, self.input)
        f = LogisticRegression(C=np.inf, tol=1e-8, max_iter=1000).fit(m[:, None], y)
        return {"slope": float(f.coef_[0, 0]), "intercept": float(f.intercept_[0])}


class IsotonicCalibrator(_Calibrator):
    """Monotone map fitted by isotonic regression (sklearn IsotonicRegression), exported as
    knots that the service interpolates with numpy.interp.

    `strict=True` (the default, what export serves) keeps the ranking: sklearn's fit is a
    step function, which gives every score of a step the same risk (a lower AUROC for no
    gain), so each step is replaced by one knot at its stays' mean score and the knots are
    joined by straight lines (centred isotonic regression), with end knots at the scores 0
    and 1 strictly inside (RISK_EPS, 1 - RISK_EPS); `strict_isotonic_knots` says how. Distinct
    probabilities then get distinct risks everywhere on [0, 1]. `strict=False` exports
    sklearn's own thresholds: what its transform with out_of_bounds="clip" gives, ties and all.
    """

    method = "isotonic"
    learned: ClassVar[dict[str, str]] = {"x": "x_thresholds_", "y": "y_thresholds_"}
    list_params = True

    def __init__(self, input: InputKind = "probability", strict: bool = True):
        self.input = input
        self.strict = strict

    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        self.models_: list[IsotonicRegression] = []  # one per column, as sklearn fitted it
        return super().fit(X, y)

    def _fit_column(self, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
        model = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(x, y)
        self.models_.append(model)
        if self.strict:
            if self.input != "probability":
                raise ValueError("a strict isotonic map reads probabilities (input="
                                 f"'probability'), not {self.input!r}")
            kx, ky = strict_isotonic_knots(model, x)
            return {"x": kx.tolist(), "y": ky.tolist()}
        return {"x": model.X_thresholds_.tolist(), "y": model.y_thresholds_.tolist()}


def strict_isotonic_knots(model: IsotonicRegression, x: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Strictly increasing knots on [0, 1] from a fitted isotonic regression and its inputs.

    One knot per step of the fit (the mean score of its stays, its observed rate); a first
    step with no event and a last step with no non-event, whose rates 0 and 1 no finite
    sample supports, get half an event (or non-event) more: 0.5 / (n + 1), at most half the
    next step's rate. End knots at the scores 0 and 1 lie halfway between the nearest step and
    the risk's bounds, so no score is clipped. Assumes probabilities (the map's `input`)."""
    xs, counts = np.unique(np.asarray(x, dtype=np.float64), return_counts=True)
    fit = model.predict(xs)
    start = np.r_[0, np.flatnonzero(np.diff(fit) > 0) + 1]  # first score of each step
    n = np.add.reduceat(counts, start).astype(np.float64)
    kx = np.add.reduceat(xs * counts, start) / n
    ky = fit[start].astype(np.float64)
    if ky[0] <= 0.0:
        ky[0] = min(0.5 / (n[0] + 1.0), ky[1] / 2 if ky.size > 1 else 0.5)
    if ky[-1] >= 1.0:
        ky[-1] = max(1.0 - 0.5 / (n[-1] + 1.0), (ky[-2] + 1.0) / 2 if ky.size > 1 else 0.5)
    ky = RISK_EPS + ky * (1.0 - 2 * RISK_EPS)  # strictly inside the served bounds
    if kx[0] > 0.0:
        kx, ky = np.r_[0.0, kx], np.r_[(RISK_EPS + ky[0]) / 2, ky]
    if kx[-1] < 1.0:
        kx, ky = np.r_[kx, 1.0], np.r_[ky, (ky[-1] + 1.0 - RISK_EPS) / 2]
    return kx, ky


# ---------------------------------------------------------------- operating points
def _point(y: np.ndarray, p: np.ndarray, t: float) -> dict[str, Any]:
    """Confusion-derived rates at `p >= t`; undefined ratios are None."""
    alert = p >= t
    pos = y == 1
    tp = int(np.sum(alert & pos))
    fp = int(np.sum(alert & ~pos))
    fn = int(np.sum(~alert & pos))
    tn = int(np.sum(~alert & ~pos))

    def ratio(a: int, b: int) -> float | None:
        return a / b if b > 0 else None

    return {
        "threshold": float(t),
        "sensitivity": ratio(tp, tp + fn),
        "ppv": ratio(tp, tp + fp),
        "specificity": ratio(tn, tn + fp),
        "alert_rate": ratio(tp + fp, len(y)),
        "tp": tp, "fp": fp, "tn": tn, "fn": fn,
    }


def operating_points(
    y: ArrayLike,
    p: ArrayLike,
    thresholds: Sequence[float] | None = None,
    targets_sensitivity: Sequence[float] = (0.5, 0.8, 0.9),
) -> list[dict[str, Any]]:
    """Rows for fixed thresholds (ascending), then for target sensitivities.

    A target row uses the highest threshold whose sensitivity is ≥ the target
    (fewest alerts); it carries `target_sensitivity`, fixed rows carry None.
    """
    yy = np.asarray(y).ravel().astype(int)
    pp = np.asarray(p, dtype=np.float64).ravel()
    if thresholds is None:
        thresholds = [round(0.1 * k, 1) for k in range(1, 10)]
    rows = [{**_point(yy, pp, t), "target_sensitivity": None} for t in sorted(thresholds)]
    pos_scores = np.sort(pp[yy == 1])[::-1]
    for target in targets_sensitivity:
        if pos_scores.size == 0:
            break
        k = max(1, math.ceil(target * pos_scores.size - 1e-9))
        t = pos_scores[min(k, pos_scores.size) - 1]
        rows.append({**_point(yy, pp, t), "target_sensitivity": float(target)})
    return rows


# ---------------------------------------------------------------- named operating points
#: The PPV the `high_ppv` point must reach on validation: one alert in two is a true event.
HIGH_PPV_LEVEL = 0.5
#: The sensitivity the `high_sensitivity` point must reach on validation.
HIGH_SENSITIVITY_LEVEL = 0.8
#: True positives a `high_ppv` threshold needs on validation, so that one lucky stay at the
#: top of the ranking cannot make a PPV.
MIN_TRUE_POSITIVES = 10
#: The share of `balanced`'s true positives a `high_ppv` threshold must still catch: its PPV
#: is then measured on enough events to mean something, and it still alerts for many of the
#: patients `balanced` finds.
HIGH_PPV_KEEPS = 0.5

#: How each named point is chosen, in words (stored with each point in the manifest).
RULES = {
    "high_sensitivity": (f"the highest risk threshold with sensitivity >= "
                         f"{HIGH_SENSITIVITY_LEVEL:g} on validation, at most balanced's"),
    "balanced": ("the risk threshold maximizing min(sensitivity, PPV) on validation (the "
                 "PhysioNet 2012 Challenge's Event 1)"),
    "high_ppv": (f"the risk threshold above balanced's with the highest PPV on validation "
                 f"among those still catching at least {HIGH_PPV_KEEPS:.0%} of balanced's true "
                 f"positives (and >= {MIN_TRUE_POSITIVES}); its PPV must exceed balanced's and "
                 f"reach {HIGH_PPV_LEVEL:g}"),
}


def point_stats(y: ArrayLike, risk: ArrayLike, t: float) -> dict[str, Any]:
    """n, sensitivity, specificity, PPV, NPV and alert rate of `risk >= t` (None if undefined)."""
    yy = np.asarray(y).ravel().astype(int)
    r = _point(yy, np.asarray(risk, dtype=np.float64).ravel(), t)
    tn, fn = r["tn"], r["fn"]
    return {"n": len(yy), "sensitivity": r["sensitivity"], "specificity": r["specificity"],
            "ppv": r["ppv"], "npv": tn / (tn + fn) if tn + fn > 0 else None,
            "alert_rate": float(r["alert_rate"] or 0.0)}


def _curve(y: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct thresholds (descending) with the true and false positives of `r >= t`."""
    order = np.argsort(-r, kind="stable")
    rs, ys = r[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(rs) != 0), len(rs) - 1]  # end of each tie block
    tp = np.cumsum(ys)[last]
    fp = np.cumsum(1 - ys)[last]
    return rs[last], tp, fp


def named_point_rules(y: ArrayLike, risk: ArrayLike, on: str = "validation"
                      ) -> tuple[dict[str, tuple[float, str]], dict[str, str]]:
    """(thresholds on the validation risk by name with the rule in words, and why each rule
    that validation cannot meet is not met; `on` is the adjective those reasons give the
    stays: "validation").

    The points are ordered by construction: thresholds high_sensitivity <= balanced <
    high_ppv, and PPV rises in the same order, so each name means what it says and a level
    defined on a later point fires for fewer patients. balanced (the Challenge's Event 1,
    the higher threshold on a tie) anchors the other two; high_sensitivity is the highest
    threshold with sensitivity >= HIGH_SENSITIVITY_LEVEL at or below it (its PPV is then at
    most balanced's: a lower threshold with both more sensitivity and more PPV would have a
    higher Event 1); high_ppv is `RULES["high_ppv"]`, the lowest such threshold on a PPV tie.
    A point whose rule cannot be met is left out, never approximated.
    """
    yy = np.asarray(y).ravel().astype(int)
    r = np.asarray(risk, dtype=np.float64).ravel()
    pos = int(yy.sum())
    if pos == 0 or pos == len(yy):
        why = f"the {on} stays are of one outcome only"
        return {}, {n: why for n in RULES}
    t, tp, fp = _curve(yy, r)  # thresholds descending
    se, ppv = tp / pos, tp / (tp + fp)
    score = np.minimum(se, ppv)
    bal = int(np.flatnonzero(score == score.max())[0])  # the highest threshold on a tie
    out: dict[str, tuple[float, str]] = {}
    unmet: dict[str, str] = {}
    ok = np.flatnonzero(se[bal:] >= HIGH_SENSITIVITY_LEVEL - 1e-12)
    if ok.size:
        out["high_sensitivity"] = (float(t[bal + ok[0]]), RULES["high_sensitivity"])
    else:
        unmet["high_sensitivity"] = (f"no threshold reaches sensitivity "
                                     f"{HIGH_SENSITIVITY_LEVEL:g} on the {on} stays")
    out["balanced"] = (float(t[bal]), RULES["balanced"])
    need = max(MIN_TRUE_POSITIVES, math.ceil(HIGH_PPV_KEEPS * tp[bal] - 1e-9))
    above = np.flatnonzero(tp[:bal] >= need)  # thresholds above balanced's keeping enough
    best = None
    if above.size:  # the highest PPV; on a tie the lowest threshold (the last, descending)
        best = int(above[ppv[above] >= ppv[above].max() - 1e-12][-1])
    if best is not None and ppv[best] > ppv[bal] + 1e-12 and ppv[best] >= HIGH_PPV_LEVEL:
        out["high_ppv"] = (float(t[best]), RULES["high_ppv"])
    else:
        reached = "" if best is None else f" (the best reaches {ppv[best]:.2f})"
        unmet["high_ppv"] = (f"no threshold above balanced's catches >= {need} true positives "
                             f"with a PPV above balanced's ({ppv[bal]:.2f}) and >= "
                             f"{HIGH_PPV_LEVEL:g} on the {on} stays{reached}")
    return {k: out[k] for k in RULES if k in out}, unmet


def choose_named_points(y: ArrayLike, risk: ArrayLike) -> dict[str, tuple[float, str]]:
    """Thresholds on the validation risk, by name, with the rule in words
    (`named_point_rules`, without the reasons for rules not met)."""
    return named_point_rules(y, risk)[0]
