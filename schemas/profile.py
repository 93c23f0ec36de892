"""The input profile of stays: which variables were observed, and their values in fixed bins.

One implementation for both sides of drift monitoring: export counts the training split with it (the
manifest's `value_reference` and `coverage`), the service counts each served stay with it, so a
population-stability index compares like with like. It reads the discretized, not yet normalized
tensor (`scehr.schemas.tensorize.discretize`): a value counts once per hour it was observed (its
mask column is 1), a categorical value by its category.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from scehr.schemas.featureset import FeatureSet

#: Bins per continuous variable (cut at training deciles of its observed values).
VALUE_BINS = 10
#: Floor on bin fractions inside the PSI, so an empty bin gives a large but finite term.
PSI_FLOOR = 1e-4


def bin_index(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin k holds edges[k-1] <= v < edges[k] (bin 0 below edges[0], the last from edges[-1])."""
    return np.searchsorted(edges, values, side="right")


@dataclass(frozen=True)
class Bins:
    """Per variable: the interior cut points (None for categorical: one bin per category)."""

    edges: tuple[np.ndarray | None, ...]
    width: int  # bins of the widest variable: counts are [.., V, width]

    @classmethod
    def of(cls, fs: FeatureSet, edges: dict[str, list[float]]) -> Bins:
        out: list[np.ndarray | None] = []
        width = 1
        for v in fs.variables:
            if v.is_categorical:
                out.append(None)
                width = max(width, len(v.categories))
            else:
                e = np.asarray(edges.get(v.id, []), dtype=np.float64)
                out.append(e)
                width = max(width, len(e) + 1)
        return cls(tuple(out), width)

    @cached_property
    def categorical(self) -> np.ndarray:
        """[V] True for the variables counted by category."""
        return np.array([e is None for e in self.edges], dtype=bool)

    def layout(self, fs: FeatureSet) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per variable: [V, width] the tensor columns read for it (a categorical one's one-hot
        columns, padded with its first; a continuous one's value column), [V, width - 1] its
        cut points padded with +inf (never at or below a value), [V] how many it has.
        Computed once per feature set (kept on this instance)."""
        cache = self.__dict__.setdefault("_layouts", {})
        if fs not in cache:
            cache[fs] = self._layout(fs)
        return cache[fs]

    def _layout(self, fs: FeatureSet) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cols = np.repeat(fs.begins[:, None], self.width, axis=1)
        cuts = np.full((fs.n_channels, max(self.width - 1, 1)), np.inf)
        n_cuts = np.zeros(fs.n_channels, dtype=np.int64)
        for k, e in enumerate(self.edges):
            if e is None:
                n = len(fs.variables[k].categories)
                cols[k, :n] += np.arange(n)
            else:
                cuts[k, : len(e)] = e
                n_cuts[k] = len(e)
        return cols, cuts, n_cuts

    def n_bins(self, fs: FeatureSet, k: int) -> int:
        e = self.edges[k]
        return len(fs.variables[k].categories) if e is None else len(e) + 1


def observed_mask(x: np.ndarray, lengths: np.ndarray, fs: FeatureSet) -> np.ndarray:
    """[N, T, V] True where a variable was observed in a valid hour of the stay."""
    masks = x[:, :, fs.n_value_columns : fs.n_value_columns + fs.n_channels] > 0.5
    valid = np.arange(x.shape[1])[None, :] < np.asarray(lengths)[:, None]
    return masks & valid[:, :, None]


def value_counts(x: np.ndarray, lengths: np.ndarray, fs: FeatureSet, bins: Bins,
                 observed: np.ndarray | None = None) -> np.ndarray:
    """[N, V, width] per stay and variable: observed hours per value bin (int32).

    Vectorised over variables (the service counts every request): a continuous value's bin is
    the number of its cut points at or below it (`bin_index`), a categorical one's its
    one-hot position; one `bincount` over the observed cells then counts them all. Cells are
    read from the flat tensor by offset (one 1-D gather each, far cheaper than 3-D fancy
    indexing at one stay), and only categorical cells read their one-hot columns.
    `observed`: `observed_mask(x, lengths, fs)` when the caller has it already."""
    n, t, f = x.shape
    v, w = fs.n_channels, bins.width
    if observed is None:
        observed = observed_mask(x, lengths, fs)
    stay, hour, k = np.nonzero(observed)
    cols, cuts, n_cuts = bins.layout(fs)
    flat = x.reshape(-1)
    at = (stay * t + hour) * f
    value = flat[at + cols[k, 0]].astype(np.float64)  # its value / first one-hot column
    b = (value[:, None] >= cuts[k]).sum(axis=1)
    nan = np.isnan(value)
    if nan.any():
        b[nan] = n_cuts[k[nan]]
    cat = bins.categorical[k].nonzero()[0]
    if len(cat):
        b[cat] = flat[at[cat, None] + cols[k[cat]]].argmax(axis=1)
    cell = (stay * v + k) * w + b
    return np.bincount(cell, minlength=n * v * w).astype(np.int32).reshape(n, v, w)


def stays_observed(x: np.ndarray, lengths: np.ndarray, fs: FeatureSet,
                   observed: np.ndarray | None = None) -> np.ndarray:
    """[N, V] True where the variable was observed at least once in the stay's window.
    `observed`: `observed_mask(x, lengths, fs)` when the caller has it already."""
    if observed is None:
        observed = observed_mask(x, lengths, fs)
    return observed.any(axis=1)


def decile_edges(x: np.ndarray, lengths: np.ndarray, fs: FeatureSet,
                 n_bins: int = VALUE_BINS) -> dict[str, list[float]]:
    """Per continuous variable observed in `x`: distinct interior cut points at its quantiles."""
    seen = observed_mask(x, lengths, fs)
    out: dict[str, list[float]] = {}
    levels = np.linspace(0, 1, n_bins + 1)[1:-1]
    for k, (var, begin) in enumerate(zip(fs.variables, fs.begins, strict=True)):
        if var.is_categorical:
            continue
        vals = x[:, :, begin][seen[:, :, k]].astype(np.float64)
        if vals.size:
            out[var.id] = np.unique(np.round(np.quantile(vals, levels), 6)).tolist()
    return out


def psi(expected: np.ndarray, actual_counts: np.ndarray) -> float | None:
    """Population-stability index Σ (a − e) ln(a / e) of observed counts against reference
    fractions (each floored at PSI_FLOOR); None without observations."""
    total = float(actual_counts.sum())
    if total <= 0:
        return None
    a = np.maximum(actual_counts / total, PSI_FLOOR)
    e = np.maximum(np.asarray(expected, dtype=np.float64), PSI_FLOOR)
    return float(np.sum((a - e) * np.log(a / e)))
