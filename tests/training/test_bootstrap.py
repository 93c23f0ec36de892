"""Bootstrap CIs, paired differences and seed summaries."""

import numpy as np
import pytest

from scehr.training.bootstrap import (
    bootstrap_ci,
    bootstrap_metrics,
    format_ci,
    format_mean_sd,
    mean_sd,
    paired_bootstrap_diff,
    resample_indices,
)
from scehr.training.metrics import auroc


def _data(n, seed=0, signal=1.0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    p = 1 / (1 + np.exp(-(signal * (2 * y - 1) + rng.normal(size=n))))
    return y, p


def test_ci_contains_value_and_narrows_with_n():
    widths = []
    for n in (100, 1000):
        y, p = _data(n)
        ci = bootstrap_ci(auroc, y, p, n_boot=200, seed=0)
        assert ci["low"] <= ci["value"] <= ci["high"]
        assert ci["n_valid"] == 200 and ci["n_boot"] == 200
        widths.append(ci["high"] - ci["low"])
    assert widths[1] < widths[0]


def test_deterministic_with_seed_and_vectorised_indices():
    y, p = _data(80)
    assert bootstrap_ci(auroc, y, p, n_boot=50, seed=3) == bootstrap_ci(
        auroc, y, p, n_boot=50, seed=3)
    blocks = list(resample_indices(80, 50, seed=0))
    assert sum(len(b) for b in blocks) == 50 and blocks[0].shape[1] == 80


def test_single_class_resamples_skipped():
    y = np.array([1, 0, 0, 0, 0, 0, 0, 0, 0, 0])  # one positive: ~35% resamples lack it
    p = np.linspace(0.9, 0.0, 10)
    ci = bootstrap_ci(auroc, y, p, n_boot=200, seed=0)
    assert 0 < ci["n_valid"] < 200
    assert ci["value"] == 1.0 and ci["high"] == 1.0


def test_paired_identical_gives_zero():
    y, p = _data(200)
    d = paired_bootstrap_diff(auroc, y, p, p.copy(), n_boot=100)
    assert d["diff"] == 0.0 and d["low"] == 0.0 and d["high"] == 0.0
    assert d["p_value"] == 1.0


def test_paired_sign_and_significance():
    y, good = _data(300, signal=2.0)
    rng = np.random.default_rng(5)
    bad = 0.3 * good + 0.7 * rng.random(300)  # much noisier ranking
    d = paired_bootstrap_diff(auroc, y, good, bad, n_boot=200)
    assert d["diff"] > 0 and d["low"] > 0 and d["p_value"] < 0.05
    d2 = paired_bootstrap_diff(auroc, y, bad, good, n_boot=200)
    assert d2["diff"] == pytest.approx(-d["diff"]) and d2["high"] < 0


def test_bootstrap_metrics_tasks():
    y, p = _data(150)
    out = bootstrap_metrics("mortality", y, p, n_boot=50)
    assert set(out) == {"auroc", "auprc"}
    rng = np.random.default_rng(0)
    Y = rng.integers(0, 2, (150, 3))
    Y[:, 2] = 0  # constant label is dropped, not fatal
    P = np.clip(Y * 0.3 + rng.random((150, 3)) * 0.7, 0, 1)
    out = bootstrap_metrics("phenotypes", Y, P, n_boot=50)
    assert out["macro_auroc"]["n_valid"] == 50
    assert out["micro_auroc"]["low"] <= out["micro_auroc"]["value"] <= out["micro_auroc"]["high"]


def test_mean_sd_and_formatting():
    s = mean_sd([0.84, 0.85, 0.836])
    assert s["n"] == 3 and s["sd"] == pytest.approx(np.std([0.84, 0.85, 0.836], ddof=1))
    assert format_mean_sd([0.842, 0.842]) == "0.842 ± 0.000"
    assert mean_sd([0.5])["sd"] == 0.0
    assert format_ci({"value": 0.8421, "low": 0.82, "high": 0.861}) == "0.842 [0.820, 0.861]"
