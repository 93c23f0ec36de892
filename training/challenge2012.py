"""The PhysioNet/CinC Challenge 2012 scores, as its own scorer computes them.

Event 1 is min(Se, +P) of a binary prediction (an alert); Event 2 is the Hosmer–Lemeshow H
statistic of the risk, normalised by the range of decile risks, exactly as the Challenge's
`lemeshow.m` (Silva, v1.4): stays sorted by risk with a stable sort, D = 10 groups of
M = floor(N/10) stays from the lowest risk up (the top N − 10·M stays fall outside every group),
H_d = (O_d − M·c_d)² / (M·c_d·(1 − c_d) + 0.001) with c_d the group's mean risk, and
H = Σ_d H_d / (c_10 − c_1). Lower is better; the winners reached 17.88 on set C.

The alert threshold for Event 1 is chosen on validation data (never on the test set); the
best possible threshold on the test set is reported beside it for reference only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from sklearn.metrics import precision_recall_curve

from scehr.training.bootstrap import bootstrap_ci

DECILES = 10


def _arrays(y: ArrayLike, p: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    yy = np.asarray(y, dtype=np.float64).ravel()
    pp = np.asarray(p, dtype=np.float64).ravel()
    if yy.shape != pp.shape:
        raise ValueError(f"labels {yy.shape} and risks {pp.shape} differ in length")
    return yy, pp


def event1(y: ArrayLike, alert: ArrayLike) -> float:
    """min(sensitivity, positive predictivity) of 0/1 alerts; NaN without deaths or alerts."""
    yy, aa = _arrays(y, alert)
    tp = float(np.sum((aa > 0) & (yy > 0)))
    deaths, alerts = float(np.sum(yy > 0)), float(np.sum(aa > 0))
    if deaths == 0 or alerts == 0:
        return float("nan")
    return min(tp / deaths, tp / alerts)


def event1_threshold(y: ArrayLike, p: ArrayLike) -> tuple[float, float]:
    """(threshold, Event 1) maximising min(Se, +P) of `p >= threshold` on these stays."""
    yy, pp = _arrays(y, p)
    if yy.min(initial=0) == yy.max(initial=0):
        raise ValueError("choosing an Event 1 threshold needs both outcomes")
    precision, recall, thresholds = precision_recall_curve(yy, pp)
    score = np.minimum(precision[:-1], recall[:-1])  # the last point has no threshold
    best = int(np.argmax(score))
    return float(thresholds[best]), float(score[best])


def hosmer_lemeshow(y: ArrayLike, p: ArrayLike, normalized: bool = True) -> float:
    """H as `lemeshow.m` computes it (normalised by c_10 − c_1 unless `normalized=False`)."""
    yy, pp = _arrays(y, p)
    m = len(yy) // DECILES
    if m == 0:
        return float("nan")
    order = np.argsort(pp, kind="stable")
    groups = order[: DECILES * m].reshape(DECILES, m)
    observed = yy[groups].sum(axis=1)
    centroid = pp[groups].mean(axis=1)
    h = float(np.sum((observed - m * centroid) ** 2 / (m * centroid * (1 - centroid) + 0.001)))
    if not normalized:
        return h
    spread = float(centroid[-1] - centroid[0])
    return h / spread if spread > 0 else float("inf")


def challenge_scores(y_val: ArrayLike, p_val: ArrayLike, y_test: ArrayLike, p_test: ArrayLike,
                     n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Event 1 (threshold from validation) and Event 2 on the test set, with bootstrap CIs.

    `p_*` must be the risk the service presents (the calibrated probability): Event 2 scores
    calibration, so scoring an uncalibrated read-out would misstate what users see.
    """
    threshold, val_event1 = event1_threshold(y_val, p_val)

    def at_threshold(y: np.ndarray, p: np.ndarray) -> float:
        return event1(y, p >= threshold)

    def best(y: np.ndarray, p: np.ndarray) -> float:
        return event1_threshold(y, p)[1] if y.min() != y.max() else float("nan")

    def plain_h(y: np.ndarray, p: np.ndarray) -> float:
        return hosmer_lemeshow(y, p, normalized=False)

    yt, pt = _arrays(y_test, p_test)
    kw: dict[str, Any] = {"n_boot": n_boot, "seed": seed}
    return {
        "event1_threshold": threshold,
        "event1_val": val_event1,
        "event1": bootstrap_ci(at_threshold, yt, pt, **kw),
        "event1_best_threshold_on_test": bootstrap_ci(best, yt, pt, **kw),
        "event2_h_normalized": bootstrap_ci(hosmer_lemeshow, yt, pt, **kw),
        "event2_h": bootstrap_ci(plain_h, yt, pt, **kw),
        "winners_set_c": {"event1": 0.5353, "event2_h_normalized": 17.88},
    }
