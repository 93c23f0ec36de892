"""Embedding quality: class separation, intra-class spread, linear-probe AUROC.

These measure what the contrastive regulariser is meant to improve (classes
apart on the unit sphere, each class compact) independently of the anchor head.
Geometry is computed on L2-normalised embeddings, as SCR uses ẑ = z / ‖z‖.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from scehr.training.metrics import auroc, l2_normalize


def _split(Z: ArrayLike, y: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    Zn = l2_normalize(Z)
    yy = np.asarray(y).ravel()
    if Zn.ndim != 2 or len(Zn) != len(yy):
        raise ValueError(f"expected Z [N, D] and y [N], got {Zn.shape} and {yy.shape}")
    return Zn, yy


def separation_score(Z: ArrayLike, y: ArrayLike) -> float:
    """‖ĉ₁ − ĉ₀‖ of the L2-normalised class centres of normalised embeddings (0..2).

    NaN if a class is absent.
    """
    Zn, yy = _split(Z, y)
    if not (np.any(yy == 1) and np.any(yy == 0)):
        return float("nan")
    c1 = l2_normalize(Zn[yy == 1].mean(axis=0))
    c0 = l2_normalize(Zn[yy == 0].mean(axis=0))
    return float(np.linalg.norm(c1 - c0))


def intra_class_spread(Z: ArrayLike, y: ArrayLike) -> dict[str, float | None]:
    """Mean distance of normalised embeddings to their class centroid, per class.

    The centroid is the plain mean of the normalised embeddings (not re-projected
    onto the sphere), so a perfectly collapsed class has spread 0.
    """
    Zn, yy = _split(Z, y)
    out: dict[str, float | None] = {}
    for name, cls in (("negative", 0), ("positive", 1)):
        members = Zn[yy == cls]
        if len(members) == 0:
            out[name] = None
            continue
        out[name] = float(np.linalg.norm(members - members.mean(axis=0), axis=1).mean())
    return out


def linear_probe_auroc(
    Z_train: ArrayLike,
    y_train: ArrayLike,
    Z_test: ArrayLike,
    y_test: ArrayLike,
    C: float = 1.0,
    max_iter: int = 1000,
) -> float:
    """Test AUROC of a logistic regression fitted on frozen train embeddings.

    Standardised features for a well-conditioned fit; NaN if either split is
    single-class.
    """
    Ztr, ytr = np.asarray(Z_train, dtype=np.float64), np.asarray(y_train).ravel()
    Zte, yte = np.asarray(Z_test, dtype=np.float64), np.asarray(y_test).ravel()
    if ytr.min(initial=0) == ytr.max(initial=0) or yte.min(initial=0) == yte.max(initial=0):
        return float("nan")
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter))
    probe.fit(Ztr, ytr)
    return auroc(yte, probe.predict_proba(Zte)[:, 1])


def _none_if_nan(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def embedding_quality(
    Z_train: ArrayLike, y_train: ArrayLike, Z_test: ArrayLike, y_test: ArrayLike
) -> dict[str, Any]:
    """Binary report: separation and spread on the test split, plus probe AUROC."""
    return {
        "separation": _none_if_nan(separation_score(Z_test, y_test)),
        "intra_class_spread": intra_class_spread(Z_test, y_test),
        "linear_probe_auroc": _none_if_nan(linear_probe_auroc(Z_train, y_train, Z_test, y_test)),
    }


def embedding_quality_multilabel(
    Z_train: ArrayLike,
    Y_train: ArrayLike,
    Z_test: ArrayLike,
    Y_test: ArrayLike,
    label_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Per-label binary reports for each 0/1 column, plus means over defined labels."""
    Ytr, Yte = np.asarray(Y_train), np.asarray(Y_test)
    if Ytr.ndim != 2 or Yte.ndim != 2 or Ytr.shape[1] != Yte.shape[1]:
        raise ValueError(f"expected [N, C] label matrices, got {Ytr.shape} and {Yte.shape}")
    names = list(label_names) if label_names is not None else [str(c) for c in range(Ytr.shape[1])]
    if len(names) != Ytr.shape[1]:
        raise ValueError(f"{len(names)} label names for {Ytr.shape[1]} columns")
    per_label = {
        name: embedding_quality(Z_train, Ytr[:, c], Z_test, Yte[:, c])
        for c, name in enumerate(names)
    }

    def mean_of(key: str) -> float | None:
        vals = [r[key] for r in per_label.values() if r[key] is not None]
        return float(np.mean(vals)) if vals else None

    return {
        "per_label": per_label,
        "mean_separation": mean_of("separation"),
        "mean_linear_probe_auroc": mean_of("linear_probe_auroc"),
    }
