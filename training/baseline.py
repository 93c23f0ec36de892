"""The model a user would otherwise pick: logistic regression on 48-hour summary statistics.

Features come from the same un-normalised discretised tensor the LSTM sees, but only from bins
where a channel was actually observed (its mask column), so forward-filled and normal-value
imputed cells do not dilute them:

- continuous channel: first, last, min, max, mean, last − first and the count of observed bins;
- categorical channel (capillary refill, GCS): the mean of its one-hot columns over observed
  bins (the share of observations in each category; no ordinal scores to maintain) and the count;
- demographics: static_raw median-imputed (training medians) plus a missing flag each.

A channel never observed in a stay has NaN summaries (count 0), which a median imputer fitted on
the training split fills; StandardScaler then LogisticRegression (class_weight None, as the
LSTM's loss is unweighted), with C picked on the validation headline metric. Phenotypes use
one-vs-rest over the label columns.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from schemas.featureset import STATIC_FIELDS, FeatureSet
from schemas.tasks import task_spec
from schemas.tensorize import StaticImputer
from training.data.splits import SplitArrays
from training.metrics import task_metrics

C_GRID: tuple[float, ...] = (0.001, 0.01, 0.1, 1.0, 10.0)
_STATS = ("first", "last", "min", "max", "mean", "delta", "count")


def feature_names(fs: FeatureSet) -> list[str]:
    """Column names of `summary_features` (same order)."""
    names: list[str] = []
    for v in fs.variables:
        if v.is_categorical:
            names += [f"{v.id}={c}:share" for c in v.categories] + [f"{v.id}:count"]
        else:
            names += [f"{v.id}:{s}" for s in _STATS]
    for s in STATIC_FIELDS:
        names += [s, f"{s}:missing"]
    return names


def summary_features(x: np.ndarray, lengths: np.ndarray, fs: FeatureSet) -> np.ndarray:
    """[N, T, F] un-normalised values + masks -> [N, K] per-channel summaries (NaN = unobserved).

    Demographics are appended by `LogisticBaseline` (they need training medians).
    """
    n, t, _ = x.shape
    valid = np.arange(t)[None, :] < np.asarray(lengths)[:, None]
    steps = np.arange(t)[None, :]
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
            continue
        val = x[:, :, b].astype(np.float64)
        first_i = np.where(obs, steps, t).min(axis=1)
        last_i = np.where(obs, steps, -1).max(axis=1)
        rows = np.arange(n)
        first = np.where(seen, val[rows, np.minimum(first_i, t - 1)], np.nan)
        last = np.where(seen, val[rows, np.maximum(last_i, 0)], np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(obs, val, 0.0).sum(axis=1) / count
        vmin = np.where(seen, np.where(obs, val, np.inf).min(axis=1), np.nan)
        vmax = np.where(seen, np.where(obs, val, -np.inf).max(axis=1), np.nan)
        cols += [first, last, vmin, vmax, mean, last - first, count]
    return np.stack(cols, axis=1)


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

    def features(self, split: SplitArrays) -> np.ndarray:
        static = self.static.transform(split.static_raw)
        return np.hstack([summary_features(split.x, split.lengths, self.fs), static])

    def predict_proba(self, split: SplitArrays) -> np.ndarray:
        """[N, C] probabilities in label order (C = 1 for mortality)."""
        p = self.pipeline.predict_proba(self.features(split))
        return p if task_spec(self.task).multi_label else p[:, 1:2]

    def summary(self) -> dict[str, Any]:
        return {"model": "logistic_regression", "C": self.C,
                "val_scores": {str(c): s for c, s in self.val_scores.items()},
                "fit_seconds": self.fit_seconds, "n_features": len(feature_names(self.fs))}


def _pipeline(task: str, C: float) -> Pipeline:
    lr = LogisticRegression(C=C, max_iter=2000)
    clf = OneVsRestClassifier(lr) if task_spec(task).multi_label else lr
    return make_pipeline(SimpleImputer(strategy="median", keep_empty_features=True),
                         StandardScaler(), clf)


def fit_logistic_baseline(
    train: SplitArrays, val: SplitArrays, task: str | None = None,
    c_grid: Sequence[float] = C_GRID,
) -> LogisticBaseline:
    """Fit one pipeline per C on train, keep the best on the validation headline metric.

    `task` defaults to the split's own.
    """
    t0 = time.perf_counter()
    task = task or train.task
    fs = train.feature_set
    static = StaticImputer.fit(train.static_raw)
    probe = LogisticBaseline(task, fs, static, _pipeline(task, 1.0), 1.0, {}, 0.0,
                             list(train.label_names))
    x_tr, x_va = probe.features(train), probe.features(val)
    multi = task_spec(task).multi_label
    y_tr = train.y if multi else train.y[:, 0]
    best: tuple[float, float, Pipeline] | None = None
    scores: dict[float, float] = {}
    for c in c_grid:
        pipe = _pipeline(task, c).fit(x_tr, y_tr)
        p = pipe.predict_proba(x_va)
        p = p if multi else p[:, 1:2]
        m = task_metrics(task, val.y, p)
        score = m[m["headline"]]
        scores[c] = float("nan") if score is None else float(score)
        if score is not None and (best is None or score > best[0]):
            best = (score, c, pipe)
    if best is None:
        raise ValueError("validation metric undefined for every C (single-class validation set?)")
    probe.pipeline, probe.C, probe.val_scores = best[2], best[1], scores
    probe.fit_seconds = time.perf_counter() - t0
    return probe


def baseline_predictions(model: LogisticBaseline, split: SplitArrays) -> dict[str, np.ndarray]:
    """Same keys as training.fit.predict where they apply: probability [N, C], y [N, C]."""
    return {"probability": model.predict_proba(split),
            "y": np.asarray(split.y, dtype=np.float32)}
