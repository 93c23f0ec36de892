"""The model a user would otherwise pick: logistic regression on 48-hour summary statistics.

Features come from the same un-normalised discretised tensor the LSTM sees, but only from bins
where a channel was actually observed (its mask column), so forward-filled and normal-value
imputed cells do not dilute them:

- continuous channel: first, last, min, max, mean, last − first, the least-squares slope per
  hour over observed bins (NaN under two) and the count of observed bins;
- categorical channel (capillary refill, GCS, ICU type): the mean of its one-hot columns over
  observed bins (the share of observations in each category) and the count; a channel whose
  categories are ordered scores (`Variable.ordinal`: GCS total) also gets the first, last, min,
  max and mean of its score;
- an amount per charting interval (`Variable.cumulative`: urine output) also gets its sum;
- demographics: static_raw median-imputed (training medians) plus a missing flag each.

A channel never observed in a stay has NaN summaries (count 0), which a median imputer fitted on
the training split fills; StandardScaler then LogisticRegression (class_weight None, as the
LSTM's loss is unweighted), with C picked on the validation headline metric. Phenotypes use
one-vs-rest over the label columns.

The second classical model a careful user would try is gradient boosting on the same features
(`fit_gbm_baseline`, scikit-learn's HistGradientBoostingClassifier, which handles the NaN
summaries natively); its learning rate and tree size are chosen on validation too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from scehr.schemas.featureset import STATIC_FIELDS, FeatureSet
from scehr.schemas.tasks import task_spec
from scehr.schemas.tensorize import StaticImputer
from scehr.training.data.splits import SplitArrays
from scehr.training.metrics import task_metrics

C_GRID: tuple[float, ...] = (0.001, 0.01, 0.1, 1.0, 10.0)
_STATS = ("first", "last", "min", "max", "mean", "delta", "slope", "count")
_SCORE_STATS = ("first", "last", "min", "max", "mean")
GBM_GRID: tuple[dict[str, float], ...] = tuple(
    {"learning_rate": lr, "max_leaf_nodes": leaves}
    for lr in (0.03, 0.1) for leaves in (7, 15, 31))


def feature_names(fs: FeatureSet) -> list[str]:
    """Column names of `summary_features` (same order)."""
    names: list[str] = []
    for v in fs.variables:
        if v.is_categorical:
            names += [f"{v.id}={c}:share" for c in v.categories] + [f"{v.id}:count"]
            if v.ordinal:
                names += [f"{v.id}:score:{s}" for s in _SCORE_STATS]
        else:
            names += [f"{v.id}:{s}" for s in _STATS]
            if v.cumulative:
                names.append(f"{v.id}:sum")
    for s in STATIC_FIELDS:
        names += [s, f"{s}:missing"]
    return names


def summary_features(x: np.ndarray, lengths: np.ndarray, fs: FeatureSet) -> np.ndarray:
    """[N, T, F] un-normalised values + masks -> [N, K] per-channel summaries (NaN = unobserved).

    Demographics are appended by `LogisticBaseline` (they need training medians).
    """
    t = x.shape[1]
    valid = np.arange(t)[None, :] < np.asarray(lengths)[:, None]
    cols: list[np.ndarray] = []
    for i, v in enumerate(fs.variables):
        obs = (x[:, :, fs.n_value_columns + i] > 0.5) & valid
        count = obs.sum(axis=1).astype(np.float64)
        seen = count > 0
        b, w = int(fs.begins[i]), int(fs.widths[i])
        if v.is_categorical:
            onehot = x[:, :, b : b + w].astype(np.float64) * obs[:, :, None]
            with np.errstate(invalid="ignore", divide="ignore"):
                share = onehot.sum(axis=1) / count[:, None]
            cols += [*share.T, count]
            if v.ordinal:
                score = x[:, :, b : b + w].astype(np.float64) @ np.array(
                    [float(c) for c in v.categories])
                cols += list(_stats(obs, score, count, seen)[:5])
            continue
        val = x[:, :, b].astype(np.float64)
        first, last, vmin, vmax, mean = _stats(obs, val, count, seen)
        cols += [first, last, vmin, vmax, mean, last - first, _slope(obs, val, count), count]
        if v.cumulative:
            cols.append(np.where(obs, val, 0.0).sum(axis=1))
    return np.stack(cols, axis=1)


def _stats(obs: np.ndarray, val: np.ndarray, count: np.ndarray, seen: np.ndarray
           ) -> tuple[np.ndarray, ...]:
    """First, last, min, max and mean of `val` [N, T] over observed bins (NaN if none)."""
    n, t = val.shape
    steps = np.arange(t)[None, :]
    first_i = np.where(obs, steps, t).min(axis=1)
    last_i = np.where(obs, steps, -1).max(axis=1)
    rows = np.arange(n)
    first = np.where(seen, val[rows, np.minimum(first_i, t - 1)], np.nan)
    last = np.where(seen, val[rows, np.maximum(last_i, 0)], np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(obs, val, 0.0).sum(axis=1) / count
    vmin = np.where(seen, np.where(obs, val, np.inf).min(axis=1), np.nan)
    vmax = np.where(seen, np.where(obs, val, -np.inf).max(axis=1), np.nan)
    return first, last, vmin, vmax, mean


def _slope(obs: np.ndarray, val: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Least-squares slope of value against bin index over observed bins; NaN under two."""
    t = np.arange(obs.shape[1], dtype=np.float64)[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        t_mean = np.where(obs, t, 0.0).sum(axis=1) / count
        v_mean = np.where(obs, val, 0.0).sum(axis=1) / count
        dt = np.where(obs, t - t_mean[:, None], 0.0)
        cov = (dt * np.where(obs, val - v_mean[:, None], 0.0)).sum(axis=1)
        var = (dt**2).sum(axis=1)
        return np.where((count >= 2) & (var > 0), cov / var, np.nan)


@dataclass
class LogisticBaseline:
    """Fitted pipeline plus what was chosen and why (validation scores per C)."""

    task: str
    fs: FeatureSet
    static: StaticImputer
    pipeline: Pipeline
    C: float
    val_scores: dict[float, float]
    fit_seconds: float
    label_names: list[str] = field(default_factory=list)
    model_name: str = "logistic_regression"
    params: dict[str, float] = field(default_factory=dict)

    def features(self, split: SplitArrays) -> np.ndarray:
        static = self.static.transform(split.static_raw)
        return np.hstack([summary_features(split.x, split.lengths, self.fs), static])

    def predict_proba(self, split: SplitArrays) -> np.ndarray:
        """[N, C] probabilities in label order (C = 1 for mortality)."""
        p = self.pipeline.predict_proba(self.features(split))
        return p if task_spec(self.task).multi_label else p[:, 1:2]

    def summary(self) -> dict[str, Any]:
        return {"model": self.model_name, "C": self.C, **({"params": self.params}
                                                          if self.params else {}),
                "val_scores": {str(c): s for c, s in self.val_scores.items()},
                "fit_seconds": self.fit_seconds, "n_features": len(feature_names(self.fs))}


def _pipeline(task: str, C: float) -> Pipeline:
    lr = LogisticRegression(C=C, max_iter=2000)
    clf = OneVsRestClassifier(lr) if task_spec(task).multi_label else lr
    return make_pipeline(SimpleImputer(strategy="median", keep_empty_features=True),
                         StandardScaler(), clf)


class DropEmptyColumns(TransformerMixin, BaseEstimator):
    """Drop columns with no value in training (histogram binning fails on all-NaN columns)."""

    def fit(self, X: np.ndarray, y: Any = None) -> DropEmptyColumns:
        self.keep_ = ~np.all(np.isnan(X), axis=0)
        return self

    def transform(self, X: np.ndarray) -> np.ndarray:
        return X[:, self.keep_]


def _gbm_pipeline(task: str, learning_rate: float, max_leaf_nodes: int) -> Pipeline:
    gbm = HistGradientBoostingClassifier(
        learning_rate=learning_rate, max_leaf_nodes=int(max_leaf_nodes), max_iter=500,
        l2_regularization=1.0, early_stopping=True, validation_fraction=0.1, random_state=0)
    return make_pipeline(DropEmptyColumns(),
                         OneVsRestClassifier(gbm) if task_spec(task).multi_label else gbm)


def _select(task: str, train: SplitArrays, val: SplitArrays,
            candidates: dict[float, Callable[[], Pipeline]], model_name: str
            ) -> LogisticBaseline:
    """Fit each candidate on train and keep the best on the validation headline metric."""
    t0 = time.perf_counter()
    fs = train.feature_set
    static = StaticImputer.fit(train.static_raw)
    model = LogisticBaseline(task, fs, static, _pipeline(task, 1.0), 1.0, {}, 0.0,
                             list(train.label_names), model_name)
    x_tr, x_va = model.features(train), model.features(val)
    multi = task_spec(task).multi_label
    y_tr = train.y if multi else train.y[:, 0]
    best: tuple[float, float, Pipeline] | None = None
    scores: dict[float, float] = {}
    for key, make in candidates.items():
        pipe = make().fit(x_tr, y_tr)
        p = pipe.predict_proba(x_va)
        p = p if multi else p[:, 1:2]
        m = task_metrics(task, val.y, p)
        score = m[m["headline"]]
        scores[key] = float("nan") if score is None else float(score)
        if score is not None and (best is None or score > best[0]):
            best = (score, key, pipe)
    if best is None:
        raise ValueError("validation metric undefined for every candidate (single-class "
                         "validation set?)")
    model.pipeline, model.C, model.val_scores = best[2], best[1], scores
    model.fit_seconds = time.perf_counter() - t0
    return model


def fit_logistic_baseline(
    train: SplitArrays, val: SplitArrays, task: str | None = None,
    c_grid: Sequence[float] = C_GRID,
) -> LogisticBaseline:
    """Fit one pipeline per C on train, keep the best on the validation headline metric.

    `task` defaults to the split's own.
    """
    task = task or train.task
    return _select(task, train, val, {c: partial(_pipeline, task, c) for c in c_grid},
                   "logistic_regression")


def fit_gbm_baseline(
    train: SplitArrays, val: SplitArrays, task: str | None = None,
    grid: Sequence[dict[str, float]] = GBM_GRID,
) -> LogisticBaseline:
    """Gradient boosting on the same features; grid point chosen on validation.

    `C` of the result holds the index of the chosen point in `grid` (see `summary()`).
    """
    task = task or train.task
    out = _select(task, train, val, {float(i): partial(_gbm_pipeline, task, **g)
                                     for i, g in enumerate(grid)}, "gradient_boosting")
    out.params = dict(grid[int(out.C)])
    return out


def baseline_predictions(model: LogisticBaseline, split: SplitArrays) -> dict[str, np.ndarray]:
    """Same keys as training.fit.predict where they apply: probability [N, C], y [N, C]."""
    return {"probability": model.predict_proba(split),
            "y": np.asarray(split.y, dtype=np.float32)}
