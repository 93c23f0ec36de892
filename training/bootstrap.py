"""Bootstrap confidence intervals over test stays, paired model comparison, seed summaries.

Test stays are resampled with replacement (non-parametric percentile bootstrap).
A replicate where a metric is undefined (e.g. a resample with one class) is
skipped and counted, not an error: `n_valid` says how many were used. All
metrics of one call share the same resampled indices, so paired comparisons
and multi-metric reports are consistent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from scehr.training.metrics import auprc, auroc, headline_metric, macro_auroc, micro_auroc

MetricFn = Callable[[np.ndarray, np.ndarray], float]
_BLOCK_ELEMENTS = 1 << 21  # indices generated per block (~16 MB of int64)


def resample_indices(n: int, n_boot: int, seed: int = 0) -> Iterator[np.ndarray]:
    """Yield [rows, n] index blocks (vectorised draws; memory bounded for large n)."""
    if n < 1:
        raise ValueError("cannot bootstrap an empty test set")
    rng = np.random.default_rng(seed)
    rows = max(1, min(n_boot, _BLOCK_ELEMENTS // n))
    for start in range(0, n_boot, rows):
        yield rng.integers(0, n, size=(min(rows, n_boot - start), n))


def _safe(fn: MetricFn, y: np.ndarray, p: np.ndarray) -> float:
    """Metric value, NaN when undefined (None, NaN, or sklearn's ValueError on one class)."""
    try:
        v = fn(y, p)
    except ValueError:
        return float("nan")
    return float("nan") if v is None else float(v)


def _replicates(
    fns: Sequence[MetricFn],
    y: np.ndarray,
    preds: Sequence[np.ndarray],
    n_boot: int,
    seed: int,
    progress: bool,
) -> np.ndarray:
    """[n_boot, len(fns)] replicate values; fns[k] is evaluated on (y, preds[k])."""
    out = np.full((n_boot, len(fns)), np.nan)
    bar = None
    if progress:
        try:
            from tqdm.auto import tqdm

            bar = tqdm(total=n_boot, desc="bootstrap", leave=False)
        except ImportError:  # tqdm is optional
            bar = None
    b = 0
    for block in resample_indices(len(y), n_boot, seed):
        for idx in block:
            yb = y[idx]
            for k, (fn, p) in enumerate(zip(fns, preds, strict=True)):
                out[b, k] = _safe(fn, yb, p[idx])
            b += 1
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return out


def _check(y: ArrayLike, *ps: ArrayLike) -> tuple[np.ndarray, list[np.ndarray]]:
    yy = np.asarray(y)
    arrs = [np.asarray(p, dtype=np.float64) for p in ps]
    for p in arrs:
        if len(p) != len(yy):
            raise ValueError(f"{len(yy)} labels but {len(p)} predictions")
    return yy, arrs


def _interval(values: np.ndarray, alpha: float) -> tuple[float | None, float | None, int]:
    ok = values[np.isfinite(values)]
    if ok.size == 0:
        return None, None, 0
    lo, hi = np.percentile(ok, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(lo), float(hi), int(ok.size)


def _point(fn: MetricFn, y: np.ndarray, p: np.ndarray) -> float | None:
    """Full-set value; errors propagate (a bug should not hide as 'undefined')."""
    v = fn(y, p)
    return None if v is None or not math.isfinite(float(v)) else float(v)


def bootstrap_ci(
    metric_fn: MetricFn,
    y: ArrayLike,
    p: ArrayLike,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """Point estimate on the full set and a (1 − alpha) percentile interval."""
    yy, (pp,) = _check(y, p)
    return _cis({"metric": metric_fn}, yy, pp, n_boot, alpha, seed, progress)["metric"]


def _cis(fns: dict[str, MetricFn], y: np.ndarray, p: np.ndarray, n_boot: int, alpha: float,
         seed: int, progress: bool) -> dict[str, dict[str, Any]]:
    """`bootstrap_ci` of each metric, all on the same resamples."""
    reps = _replicates(list(fns.values()), y, [p] * len(fns), n_boot, seed, progress)
    out = {}
    for k, (name, fn) in enumerate(fns.items()):
        low, high, n_valid = _interval(reps[:, k], alpha)
        out[name] = {"value": _point(fn, y, p), "low": low, "high": high,
                     "n_boot": int(n_boot), "n_valid": n_valid}
    return out


def paired_bootstrap_diff(
    metric_fn: MetricFn,
    y: ArrayLike,
    p_a: ArrayLike,
    p_b: ArrayLike,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """metric(a) − metric(b) with a CI and two-sided p-value, on shared resamples.

    p = 2 · (min(#(d ≤ 0), #(d ≥ 0)) + 1) / (n_valid + 1), capped at 1; the +1 keeps
    it from reading as exactly 0 (its resolution is 1 / n_valid).
    """
    yy, (pa, pb) = _check(y, p_a, p_b)
    reps = _replicates([metric_fn, metric_fn], yy, [pa, pb], n_boot, seed, progress)
    d = reps[:, 0] - reps[:, 1]
    low, high, n_valid = _interval(d, alpha)
    d = d[np.isfinite(d)]
    p_value = None
    if n_valid:
        k = min(int(np.sum(d <= 0)), int(np.sum(d >= 0)))
        p_value = min(1.0, 2.0 * (k + 1) / (n_valid + 1))
    va, vb = _point(metric_fn, yy, pa), _point(metric_fn, yy, pb)
    diff = None if va is None or vb is None else va - vb
    return {"diff": diff, "low": low, "high": high, "p_value": p_value,
            "n_boot": int(n_boot), "n_valid": n_valid}


def bootstrap_metrics(
    task: str,
    y: ArrayLike,
    p: ArrayLike,
    n_boot: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
    progress: bool = False,
) -> dict[str, dict[str, Any]]:
    """CIs for the headline metrics: auroc/auprc (mortality), micro/macro AUROC (phenotypes).

    For phenotypes, labels constant on the full test set are dropped first; a
    replicate where a kept label becomes constant is skipped, so every macro
    replicate averages the same labels.
    """
    yy, (pp,) = _check(y, p)
    fns: dict[str, MetricFn]
    if headline_metric(task) == "auroc":
        yy, pp = yy.ravel(), pp.ravel()
        fns = {"auroc": auroc, "auprc": auprc}
    else:
        keep = yy.min(axis=0) != yy.max(axis=0)
        yy, pp = yy[:, keep], pp[:, keep]
        fns = {"micro_auroc": micro_auroc,
               "macro_auroc": lambda a, b: macro_auroc(a, b, strict=True)}
    return _cis(fns, yy, pp, n_boot, alpha, seed, progress)


# ---------------------------------------------------------------- several seeds
def mean_sd(values: Sequence[float]) -> dict[str, float | int]:
    """Mean and sample SD (ddof=1; 0.0 for a single value) across seeds/runs."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("mean_sd needs at least one value")
    sd = float(np.std(v, ddof=1)) if v.size > 1 else 0.0
    return {"mean": float(np.mean(v)), "sd": sd, "n": int(v.size)}


def format_mean_sd(values: Sequence[float], digits: int = 3) -> str:
    """'0.842 ± 0.006' for several-seed tables."""
    s = mean_sd(values)
    return f"{s['mean']:.{digits}f} ± {s['sd']:.{digits}f}"


def format_ci(ci: dict[str, Any], digits: int = 3) -> str:
    """'0.842 [0.820, 0.861]' from a bootstrap_ci dict ('n/a' when undefined)."""
    if ci.get("value") is None:
        return "n/a"
    if ci.get("low") is None:
        return f"{ci['value']:.{digits}f}"
    return f"{ci['value']:.{digits}f} [{ci['low']:.{digits}f}, {ci['high']:.{digits}f}]"
