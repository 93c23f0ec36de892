"""Embedding separation, spread and linear probe on synthetic clusters."""

import numpy as np
import pytest

from scehr.training.studies.embedding_quality import (
    embedding_quality,
    embedding_quality_multilabel,
    intra_class_spread,
    separation_score,
)


def _clusters(n, gap, seed=0, d=8):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    centre = np.zeros(d)
    centre[0] = gap
    offset = 3 * np.eye(d)[1]  # shared offset so normalisation matters
    Z = rng.normal(size=(n, d)) * 0.5 + np.where(y[:, None] == 1, centre, -centre) + offset
    return Z, y


def test_separation_exact_and_ordering():
    Z = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0], [0.0, 1.0]])
    y = np.array([1, 1, 0, 0])
    assert separation_score(Z, y) == pytest.approx(np.sqrt(2))  # orthogonal unit centres
    assert intra_class_spread(Z, y) == {"negative": 0.0, "positive": 0.0}
    Zf, yf = _clusters(300, 3.0)
    Zc, yc = _clusters(300, 0.2)
    assert separation_score(Zf, yf) > separation_score(Zc, yc)
    assert np.isnan(separation_score(Z, np.ones(4)))


def test_probe_and_report():
    Ztr, ytr = _clusters(200, 1.0, seed=0)
    Zte, yte = _clusters(200, 1.0, seed=1)
    rep = embedding_quality(Ztr, ytr, Zte, yte)
    assert rep["linear_probe_auroc"] > 0.9
    assert set(rep["intra_class_spread"]) == {"negative", "positive"}
    Ytr = np.stack([ytr, 1 - ytr, np.zeros_like(ytr)], axis=1)
    Yte = np.stack([yte, 1 - yte, np.zeros_like(yte)], axis=1)
    ml = embedding_quality_multilabel(Ztr, Ytr, Zte, Yte, ["a", "b", "never"])
    assert ml["per_label"]["never"]["linear_probe_auroc"] is None
    assert ml["mean_linear_probe_auroc"] == pytest.approx(rep["linear_probe_auroc"])
