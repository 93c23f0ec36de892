"""Challenge 2012 scores against a line-by-line transliteration of lemeshow.m and hand cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scehr.training.challenge2012 import (
    challenge_scores,
    event1,
    event1_threshold,
    hosmer_lemeshow,
)


def _lemeshow_m(y: np.ndarray, p: np.ndarray) -> tuple[float, float]:
    """lemeshow.m v1.4 as written (1-based loops), returning (H normalised, H plain)."""
    d = 10
    n = len(y)
    m = n // d
    rows = sorted(zip(y.tolist(), p.tolist(), strict=True), key=lambda r: r[1])  # stable
    total, centroid = 0.0, []
    for i in range(1, d + 1):
        ind2 = i * m
        ind1 = ind2 - m + 1
        chunk = rows[ind1 - 1: ind2]
        obs = sum(r[0] for r in chunk)
        c = sum(r[1] for r in chunk) / m
        centroid.append(c)
        total += (obs - m * c) ** 2 / (m * c * (1 - c) + 0.001)
    return total / (centroid[9] - centroid[0]), total


@pytest.mark.parametrize("n", [4000, 1234, 57])
def test_hosmer_lemeshow_equals_the_challenge_code(n: int) -> None:
    rng = np.random.default_rng(n)
    p = np.round(rng.beta(1, 5, n), 2)  # rounding makes ties: the stable sort matters
    y = (rng.random(n) < p * 1.5).astype(float)
    h_norm, h_plain = _lemeshow_m(y, p)
    assert hosmer_lemeshow(y, p) == pytest.approx(h_norm, rel=1e-12)
    assert hosmer_lemeshow(y, p, normalized=False) == pytest.approx(h_plain, rel=1e-12)


def test_hosmer_lemeshow_hand_case() -> None:
    # 20 stays, M = 2: deciles of risks 0.05, 0.15, ..., 0.95; one death in each decile.
    p = np.repeat(np.arange(10) / 10 + 0.05, 2)
    y = np.tile([1.0, 0.0], 10)
    c = np.arange(10) / 10 + 0.05
    expected = np.sum((1 - 2 * c) ** 2 / (2 * c * (1 - c) + 0.001))
    assert hosmer_lemeshow(y, p, normalized=False) == pytest.approx(expected)
    assert hosmer_lemeshow(y, p) == pytest.approx(expected / 0.9)


def test_perfectly_calibrated_groups_score_near_zero() -> None:
    p = np.repeat(np.linspace(0.05, 0.5, 10), 100)
    y = np.concatenate([np.r_[np.ones(round(100 * c)), np.zeros(100 - round(100 * c))]
                        for c in np.linspace(0.05, 0.5, 10)])
    assert hosmer_lemeshow(y, p) < 0.01


def test_event1_and_threshold() -> None:
    y = np.array([1, 1, 1, 0, 0, 0, 0, 0])
    assert event1(y, [1, 1, 0, 1, 0, 0, 0, 0]) == pytest.approx(2 / 3)  # Se 2/3, +P 2/3
    assert event1(y, [1, 1, 1, 1, 1, 1, 0, 0]) == pytest.approx(0.5)  # Se 1, +P 1/2
    assert math.isnan(event1(y, np.zeros(8)))
    p = np.array([0.9, 0.8, 0.3, 0.7, 0.2, 0.1, 0.05, 0.01])
    t, best = event1_threshold(y, p)
    assert best == pytest.approx(0.75)  # alert the top 4: Se 3/3, +P 3/4
    assert t == 0.3 and event1(y, p >= t) == pytest.approx(best)


def test_challenge_scores_choose_the_threshold_on_validation_only() -> None:
    rng = np.random.default_rng(0)
    pv, pt = rng.random(500), rng.random(500)
    yv, yt = (rng.random(500) < pv).astype(float), (rng.random(500) < pt).astype(float)
    out = challenge_scores(yv, pv, yt, pt, n_boot=50)
    t, _ = event1_threshold(yv, pv)
    assert out["event1_threshold"] == t
    assert out["event1"]["value"] == pytest.approx(event1(yt, pt >= t))
    assert out["event1_best_threshold_on_test"]["value"] >= out["event1"]["value"]
    lo, hi = out["event2_h_normalized"]["low"], out["event2_h_normalized"]["high"]
    assert lo <= out["event2_h_normalized"]["value"] <= hi
