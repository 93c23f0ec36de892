"""Evaluation metrics for mortality (binary) and phenotyping (multi-label).

Numpy, scipy and sklearn only (no torch), so metrics can be recomputed from saved
predictions. Every returned value is a plain Python float/int/None so the dicts
go straight into JSON manifests. Undefined metrics (a single-class label
column) are NaN in the scalar helpers (what the bootstrap skips) and None in the
report dicts (what JSON can hold).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import rankdata
from sklearn.metrics import (
    accuracy_score,
    auc,
    precision_recall_curve,
    roc_curve,
)

from scehr.schemas.tasks import task_spec
from scehr.training.calibration import brier, expected_calibration_error


def l2_normalize(Z: ArrayLike, eps: float = 1e-12) -> np.ndarray:
    """Row-wise unit vectors (zero rows stay zero): the cosine geometry of embeddings."""
    Z = np.asarray(Z, dtype=np.float64)
    return Z / np.maximum(np.linalg.norm(Z, axis=-1, keepdims=True), eps)


def _binary(y: ArrayLike, p: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Flatten [N] or [N, 1] inputs and check they match."""
    yy = np.asarray(y).ravel()
    pp = np.asarray(p, dtype=np.float64).ravel()
    if yy.shape != pp.shape:
        raise ValueError(f"labels {yy.shape} and predictions {pp.shape} differ in length")
    return yy, pp


def _two_classes(y: np.ndarray) -> bool:
    return bool(y.size > 0 and y.min() != y.max())


def _none_if_nan(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


# ---------------------------------------------------------------- scalar metrics
def _check_finite(p: np.ndarray) -> None:
    """The ranking metrics' one input rule (sklearn raised on NaN too; ranks would hide it)."""
    if not np.isfinite(p).all():
        raise ValueError("predictions contain NaN or infinity")


def _rank_auroc(y: np.ndarray, p: np.ndarray) -> float:
    """Mann-Whitney U / (n₁·n₀), ties counted half: sklearn's roc_auc_score value at a seventh
    of its cost (its input checks dominate, and the bootstrap calls this thousands of times).
    `y` holds both classes; the greater label is the positive one, as sklearn's default."""
    _check_finite(p)
    pos = y == y.max()
    n1 = int(pos.sum())
    n0 = y.size - n1
    return float((rankdata(p)[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def auroc(y: ArrayLike, p: ArrayLike) -> float:
    """AUROC; NaN when only one class is present."""
    yy, pp = _binary(y, p)
    return _rank_auroc(yy, pp) if _two_classes(yy) else float("nan")


def _pr_points(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(precision, recall) at each distinct threshold, highest first: sklearn's
    precision_recall_curve without its closing (1, 0) point, at a fraction of its cost (the
    bootstrap calls it thousands of times). `y` holds both classes; the greater is positive."""
    _check_finite(p)
    order = np.argsort(-p, kind="mergesort")
    ranked = p[order]
    last = np.r_[np.flatnonzero(ranked[1:] != ranked[:-1]), ranked.size - 1]  # each tie group
    tps = np.cumsum(y[order] == y.max())[last]
    return tps / (last + 1), tps / tps[-1]


def auprc(y: ArrayLike, p: ArrayLike) -> float:
    """Average precision Σ (R_k − R_{k−1}) P_k (step-wise AUPRC, sklearn's
    average_precision_score); NaN when only one class is present."""
    yy, pp = _binary(y, p)
    if not _two_classes(yy):
        return float("nan")
    precision, recall = _pr_points(yy, pp)
    return float(np.sum(np.diff(recall, prepend=0.0) * precision))


def auprc_trapezoid(y: ArrayLike, p: ArrayLike) -> float:
    """Trapezoidal area under the PR curve, as mimic3-benchmarks (and the paper) report."""
    yy, pp = _binary(y, p)
    if not _two_classes(yy):
        return float("nan")
    precision, recall, _ = precision_recall_curve(yy, pp)
    return float(auc(recall, precision))


def min_se_ppv(y: ArrayLike, p: ArrayLike) -> float:
    """max over the PR curve of min(precision, recall) (mimic3-benchmarks' "minpse")."""
    yy, pp = _binary(y, p)
    if not _two_classes(yy):
        return float("nan")
    precision, recall = _pr_points(yy, pp)
    return float(np.max(np.minimum(precision, recall)))


def balanced_accuracy(y: ArrayLike, p: ArrayLike, threshold: float) -> float:
    """Mean of sensitivity and specificity at `threshold` (unweighted accuracy); NaN on one
    class."""
    yy, pp = _binary(y, p)
    if not _two_classes(yy):
        return float("nan")
    pred = pp >= threshold
    return float((np.mean(pred[yy == 1]) + np.mean(~pred[yy == 0])) / 2)


def balanced_accuracy_threshold(y: ArrayLike, p: ArrayLike) -> float:
    """The threshold maximising balanced accuracy on (y, p): Youden's J on the ROC curve."""
    yy, pp = _binary(y, p)
    if not _two_classes(yy):
        return 0.5
    fpr, tpr, thresholds = roc_curve(yy, pp)
    return float(min(thresholds[int(np.argmax(tpr - fpr))], 1.0))


def _evaluable(Y: np.ndarray) -> np.ndarray:
    """Boolean mask of label columns that contain both classes."""
    return (Y.min(axis=0) != Y.max(axis=0)) if Y.shape[0] else np.zeros(Y.shape[1], bool)


def _multilabel(Y: ArrayLike, P: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    YY = np.asarray(Y)
    PP = np.asarray(P, dtype=np.float64)
    if YY.ndim != 2 or YY.shape != PP.shape:
        raise ValueError(f"expected matching [N, C] arrays, got {YY.shape} and {PP.shape}")
    return YY, PP


def micro_auroc(Y: ArrayLike, P: ArrayLike) -> float:
    """AUROC over all (stay, label) pairs pooled; NaN if the pool is single-class."""
    YY, PP = _multilabel(Y, P)
    return auroc(YY.ravel(), PP.ravel())


def macro_auroc(Y: ArrayLike, P: ArrayLike, strict: bool = False) -> float:
    """Mean per-label AUROC over evaluable labels.

    strict=True returns NaN if any label is single-class instead of dropping it,
    so bootstrap replicates always average over the same label set.
    """
    YY, PP = _multilabel(Y, P)
    ok = _evaluable(YY)
    if not ok.any() or (strict and not ok.all()):
        return float("nan")
    return float(np.mean(_per_label_auroc(YY, PP, ok)))


def _per_label_auroc(Y: np.ndarray, P: np.ndarray, ok: np.ndarray) -> list[float]:
    return [_rank_auroc(Y[:, c], P[:, c]) for c in np.flatnonzero(ok)]


def weighted_auroc(Y: ArrayLike, P: ArrayLike) -> float:
    """Per-label AUROC weighted by positive count, over evaluable labels."""
    YY, PP = _multilabel(Y, P)
    ok = _evaluable(YY)
    if not ok.any():
        return float("nan")
    weights = (YY[:, ok] == YY[:, ok].max(axis=0)).sum(axis=0)  # positives per label
    return float(np.average(_per_label_auroc(YY, PP, ok), weights=weights))


# ---------------------------------------------------------------- report dicts
def binary_metrics(y: ArrayLike, p: ArrayLike, n_bins: int = 10) -> dict[str, Any]:
    """Headline binary metrics; ranking metrics are None on a single-class set."""
    yy, pp = _binary(y, p)
    n = int(yy.size)
    return {
        "auroc": _none_if_nan(auroc(yy, pp)),
        "auprc": _none_if_nan(auprc(yy, pp)),
        "auprc_trapezoid": _none_if_nan(auprc_trapezoid(yy, pp)),
        "min_se_ppv": _none_if_nan(min_se_ppv(yy, pp)),
        "accuracy": float(accuracy_score(yy, pp >= 0.5)) if n else None,
        "brier": brier(yy, pp) if n else None,
        "ece": _none_if_nan(expected_calibration_error(yy, pp, n_bins)),
        "prevalence": float(np.mean(yy)) if n else None,
        "n": n,
    }


def multilabel_metrics(
    Y: ArrayLike, P: ArrayLike, label_names: Sequence[str] | None = None
) -> dict[str, Any]:
    """Micro/macro/weighted AUROC and per-label AUROC (None for constant columns)."""
    YY, PP = _multilabel(Y, P)
    names = list(label_names) if label_names is not None else [str(c) for c in range(YY.shape[1])]
    if len(names) != YY.shape[1]:
        raise ValueError(f"{len(names)} label names for {YY.shape[1]} columns")
    ok = _evaluable(YY)
    per_label = {
        name: (_rank_auroc(YY[:, c], PP[:, c]) if ok[c] else None)
        for c, name in enumerate(names)
    }
    return {
        "micro_auroc": _none_if_nan(micro_auroc(YY, PP)),
        "macro_auroc": _none_if_nan(macro_auroc(YY, PP)),
        "weighted_auroc": _none_if_nan(weighted_auroc(YY, PP)),
        "per_label_auroc": per_label,
        "prevalence": {name: float(YY[:, c].mean()) for c, name in enumerate(names)}
        if YY.shape[0] else {},
        "not_evaluable": [name for c, name in enumerate(names) if not ok[c]],
        "n": int(YY.shape[0]),
        "n_labels": int(YY.shape[1]),
    }


def headline_metric(task: str) -> str:
    """Name of the model-selection metric for a task ("auroc" or "micro_auroc")."""
    return task_spec(task).headline_metric


def task_metrics(
    task: str, y: ArrayLike, p: ArrayLike, label_names: Sequence[str] | None = None
) -> dict[str, Any]:
    """Metrics for `task`, plus "headline" naming the selection metric.

    Usage: `m = task_metrics(task, y, p); score = m[m["headline"]]`.
    """
    spec = task_spec(task)
    name = spec.headline_metric
    out = binary_metrics(y, p) if spec.binary else multilabel_metrics(y, p, label_names)
    out["headline"] = name
    return out
