"""Fit the uncertainty a model serves with each risk (`scehr.schemas.uncertainty.RiskUncertainty`).

Fitted on the held-out calibration split (never trained on, never used for early stopping),
with the level of the outcome set chosen on the validation split; the test split plays no
part. The same function serves export (`scehr.training.export`) and the re-issue of a shipped model
(`scehr.training.reissue`), which scores the held-out split with the model's ONNX graph.

Inductive Venn-Abers (Vovk & Petej 2014): for a new score s, p0(s) and p1(s) are the values
at s of the isotonic regression fitted on the held-out (score, label) pairs plus (s, 0),
respectively (s, 1). Both are step functions of s that can change only at held-out scores, so
they are computed once per gap between distinct held-out scores and stored as steps.

Mondrian split-conformal (Vovk et al. 2005, label-conditional): per outcome y, the new stay's
"outcome y" is kept in its set when its risk is no less typical of y than the
ceil((n_y + 1) * level)-th held-out stay of y; this gives coverage >= level given y.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from sklearn.isotonic import IsotonicRegression

from scehr.schemas.uncertainty import LEVELS, CoverageCheck, RiskUncertainty

#: Where export fits the map (`RiskUncertainty.fitted_on`).
UNCERTAINTY_WHERE = ("calibration split (held out of training and early stopping); level "
                     "chosen on validation")

#: The share of validation stays that must get a one-outcome set for a level to be chosen:
#: above it, the set mostly says "either outcome", which a clinician cannot act on.
MIN_SINGLE = 0.5

#: How far below its level a chosen level's validation coverage may fall (overall, and among
#: the stays with the outcome when there are at least MIN_COVERAGE_POSITIVES of them): a level
#: the held-out stays do not reach there is not served as if it were met.
COVERAGE_SLACK = 0.02
MIN_COVERAGE_POSITIVES = 10


def level_holds(check: CoverageCheck, level: float) -> bool:
    """Whether validation supports serving `level`: one-outcome sets for at least MIN_SINGLE
    of the stays, and coverage no more than COVERAGE_SLACK below the level."""
    given = (check.coverage_with_outcome if check.positives >= MIN_COVERAGE_POSITIVES
             else None)
    return (check.single_outcome >= MIN_SINGLE
            and check.coverage >= level - COVERAGE_SLACK
            and (given is None or given >= level - COVERAGE_SLACK))


def venn_abers_steps(risk: np.ndarray, y: np.ndarray
                     ) -> tuple[list[float], list[float], list[float]]:
    """(cuts, p0, p1) of the inductive Venn-Abers predictor fitted on held-out (risk, y).

    Segment k (k = 0 .. m) holds the scores s with cuts[k-1] <= s < cuts[k] (the distinct
    held-out risks, ascending); a score equal to a held-out risk is placed just above it.
    Adjacent segments with the same pair are merged."""
    r = np.asarray(risk, dtype=np.float64)
    yy = np.asarray(y, dtype=np.float64)
    c = np.unique(r)
    if c.size == 0:
        return [], [0.0], [1.0]
    gaps = np.r_[c[0] - 1.0, (c[:-1] + c[1:]) / 2.0, c[-1] + 1.0]  # one score per segment
    p0, p1 = np.empty(gaps.size), np.empty(gaps.size)
    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
    for k, s in enumerate(gaps):
        x = np.r_[r, s]
        p0[k] = iso.fit(x, np.r_[yy, 0.0]).predict([s])[0]
        p1[k] = iso.fit(x, np.r_[yy, 1.0]).predict([s])[0]
    keep = np.r_[True, (np.diff(p0) != 0) | (np.diff(p1) != 0)]  # segment starts a new step
    cuts = c[keep[1:]]  # segment k starts at c[k-1]
    return cuts.tolist(), p0[keep].tolist(), p1[keep].tolist()


def conformal_bounds(risk: np.ndarray, y: np.ndarray, level: float) -> tuple[float, float]:
    """(event_from, no_event_up_to) of the label-conditional conformal set at `level`.

    The outcome is kept when the risk reaches the k1-th largest held-out risk among stays with
    the outcome, k1 = ceil((n1 + 1) * level); no outcome when the risk is at most the k0-th
    smallest among stays without it. When k exceeds the stays of that outcome, the outcome is
    always kept (0, resp. 1): too few held-out stays to exclude it."""
    r = np.asarray(risk, dtype=np.float64)
    pos = np.sort(r[np.asarray(y) > 0.5])[::-1]
    neg = np.sort(r[np.asarray(y) <= 0.5])
    k1 = math.ceil((pos.size + 1) * level - 1e-9)
    k0 = math.ceil((neg.size + 1) * level - 1e-9)
    event_from = float(pos[k1 - 1]) if k1 <= pos.size else 0.0
    no_event_up_to = float(neg[k0 - 1]) if k0 <= neg.size else 1.0
    return event_from, no_event_up_to


def coverage(u: RiskUncertainty, y: np.ndarray, risk: np.ndarray, split: str
             ) -> CoverageCheck:
    """Empirical coverage of `u`'s outcome sets on labelled stays (overall and per outcome),
    the share of one-outcome sets and the mean Venn-Abers width."""
    yy = np.asarray(y) > 0.5
    r = np.asarray(risk, dtype=np.float64)
    hit = u.covered(yy, r)
    event, no_event = u.outcome_set(r)
    low, high = u.interval(r)

    def share(mask: np.ndarray) -> float | None:
        return float(hit[mask].mean()) if mask.any() else None

    return CoverageCheck(split=split, n=int(r.size), positives=int(yy.sum()),
                         coverage=float(hit.mean()) if r.size else float("nan"),
                         coverage_with_outcome=share(yy), coverage_without_outcome=share(~yy),
                         single_outcome=float((event != no_event).mean()) if r.size else 0.0,
                         mean_width=float((high - low).mean()) if r.size else 0.0)


def fit_uncertainty(calib: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray],
                    where: str, levels: Sequence[float] = LEVELS,
                    test: tuple[np.ndarray, np.ndarray] | None = None,
                    names: tuple[str, str] = ("validation split", "test split")
                    ) -> RiskUncertainty:
    """The uncertainty map of one class from held-out (y, risk) pairs.

    Venn-Abers steps and conformal bounds are fitted on `calib`; the level is the highest of
    `levels` that the `val` stays support (`level_holds`: mostly one-outcome sets, coverage
    within COVERAGE_SLACK of the level), else the lowest, and its validation coverage is
    stored with it; `test` is only scored. `names`: what `val` and `test` are, as their
    coverage checks say."""
    yc, rc = (np.asarray(a, dtype=np.float64) for a in calib)
    yv, rv = (np.asarray(a, dtype=np.float64) for a in val)
    cuts, p0, p1 = venn_abers_steps(rc, yc)
    chosen = None
    for level in sorted(levels, reverse=True):
        ef, nu = conformal_bounds(rc, yc, level)
        u = RiskUncertainty(cuts=cuts, low=p0, high=p1, level=level, event_from=ef,
                            no_event_up_to=nu, fitted_on=where, n=int(yc.size),
                            positives=int((yc > 0.5).sum()))
        check = coverage(u, yv, rv, names[0])
        chosen = u.model_copy(update={"validation": check})
        if level_holds(check, level):
            break
    assert chosen is not None, "levels must not be empty"
    if test is not None:
        chosen = chosen.model_copy(update={"test": coverage(chosen, *test, names[1])})
    return chosen
