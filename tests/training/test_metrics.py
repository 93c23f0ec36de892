"""Metrics against hand-computed examples and sklearn, JSON-safety, edge cases."""

import json
import math

import numpy as np
import pytest

from scehr.training.metrics import (
    binary_metrics,
    headline_metric,
    min_se_ppv,
    multilabel_metrics,
    task_metrics,
)


def _min_se_ppv_loop(y, p):
    """Reference: sweep every threshold 'p >= t' and take max min(precision, recall)."""
    best = 0.0
    for t in sorted(set(p)):
        pred = [pi >= t for pi in p]
        tp = sum(1 for yi, a in zip(y, pred, strict=True) if a and yi == 1)
        fp = sum(1 for yi, a in zip(y, pred, strict=True) if a and yi == 0)
        prec, rec = tp / (tp + fp), tp / sum(y)
        best = max(best, min(prec, rec))
    return best


def test_min_se_ppv_hand_example():
    y = [0, 0, 1, 1]
    p = [0.1, 0.4, 0.35, 0.8]
    # t=0.8: P=1, R=0.5 -> 0.5; t=0.4: P=0.5, R=0.5 -> 0.5; t=0.35: P=2/3, R=1 -> 2/3
    assert min_se_ppv(y, p) == pytest.approx(2 / 3)
    rng = np.random.default_rng(1)
    y2 = rng.integers(0, 2, 60)
    p2 = np.round(rng.random(60), 2)  # ties included
    assert min_se_ppv(y2, p2) == pytest.approx(_min_se_ppv_loop(list(y2), list(p2)))


def test_binary_metrics_values_and_json():
    y = np.array([0, 0, 1, 1, 0, 1])
    p = np.array([0.1, 0.6, 0.7, 0.4, 0.2, 0.9])
    m = binary_metrics(y, p.reshape(-1, 1))  # [N, 1] model output accepted
    assert m["auroc"] == pytest.approx(8 / 9)  # 8 of 9 pos/neg pairs ranked right
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["brier"] == pytest.approx(np.mean((p - y) ** 2))
    assert m["prevalence"] == 0.5 and m["n"] == 6
    # ECE by hand: bins 0.1,0.2 | 0.4 | 0.6 | 0.7 | 0.9 (each bin a singleton or pair)
    ece = (2 * abs(0 - 0.15) + abs(1 - 0.4) + abs(0 - 0.6) + abs(1 - 0.7) + abs(1 - 0.9)) / 6
    assert m["ece"] == pytest.approx(ece)
    json.dumps(m)
    assert all(type(v) in (float, int) for v in m.values())


def test_binary_single_class_is_none_not_crash():
    m = binary_metrics([0, 0, 0], [0.1, 0.2, 0.3])
    assert m["auroc"] is None and m["auprc"] is None and m["min_se_ppv"] is None
    assert m["brier"] == pytest.approx((0.01 + 0.04 + 0.09) / 3)


def test_multilabel_constant_column_not_evaluable():
    Y = np.array([[0, 1, 0], [1, 1, 0], [0, 1, 1], [1, 1, 0]])
    P = np.array([[0.2, 0.9, 0.1], [0.8, 0.8, 0.2], [0.3, 0.7, 0.9], [0.6, 0.6, 0.3]])
    m = multilabel_metrics(Y, P, ["a", "b", "c"])
    assert m["not_evaluable"] == ["b"]
    assert m["per_label_auroc"] == {"a": 1.0, "b": None, "c": 1.0}
    assert m["macro_auroc"] == pytest.approx(1.0)
    assert 0.0 <= m["micro_auroc"] <= 1.0
    json.dumps(m)


def test_task_metrics_dispatch():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 50)
    m = task_metrics("mortality", y, rng.random(50))
    assert m["headline"] == "auroc" and isinstance(m[m["headline"]], float)
    Y = rng.integers(0, 2, (50, 4))
    m = task_metrics("phenotypes", Y, rng.random((50, 4)))
    assert m["headline"] == "micro_auroc" and set(m["per_label_auroc"]) == {"0", "1", "2", "3"}
    assert headline_metric("phenotyping") == "micro_auroc"
    with pytest.raises(ValueError):
        task_metrics("los", y, y)
    assert not math.isnan(m["weighted_auroc"])


@pytest.mark.parametrize("seed", range(6))
def test_fast_ranking_metrics_equal_sklearn_with_ties_and_label_encodings(seed: int) -> None:
    """The bootstrap's fast AUROC (ranks, ties counted half), AUPRC and min(Se, P+) give
    sklearn's values: binary with {0, 1}, bool and {-1, 1} labels, micro, macro and
    positive-weighted multi-label AUROC."""
    from sklearn.metrics import average_precision_score, precision_recall_curve, roc_auc_score

    from scehr.training.metrics import (
        auprc,
        auroc,
        macro_auroc,
        micro_auroc,
        min_se_ppv,
        weighted_auroc,
    )

    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 400))
    y = (rng.random(n) < rng.uniform(0.05, 0.6)).astype(int)
    y[:2] = [0, 1]
    p = np.round(rng.random(n), int(rng.integers(1, 4)))  # few decimals: many ties
    want = roc_auc_score(y, p)
    precision, recall, _ = precision_recall_curve(y, p)
    for labels in (y, y.astype(bool), 2 * y - 1, y.astype(float)):
        assert auroc(labels, p) == pytest.approx(want, abs=1e-12)
        assert auprc(labels, p) == pytest.approx(average_precision_score(y, p), abs=1e-12)
        assert min_se_ppv(labels, p) == pytest.approx(np.max(np.minimum(precision, recall)),
                                                      abs=1e-12)
    Y = (rng.random((n, 5)) < 0.3).astype(int)
    Y[:2] = [[0] * 5, [1] * 5]
    P = np.round(rng.random((n, 5)), 2)
    assert micro_auroc(Y, P) == pytest.approx(roc_auc_score(Y.ravel(), P.ravel()), abs=1e-12)
    assert macro_auroc(Y, P) == pytest.approx(roc_auc_score(Y, P, average="macro"), abs=1e-12)
    assert weighted_auroc(Y, P) == pytest.approx(roc_auc_score(Y, P, average="weighted"),
                                                 abs=1e-12)
    with pytest.raises(ValueError, match="NaN"):
        auroc(y, np.where(np.arange(n) == 3, np.nan, p))
