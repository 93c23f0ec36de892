"""A straightforward per-row discretizer, written from the mimic3-benchmarks semantics.

It walks the rows of each stay in order exactly like `Discretizer.transform` (timestep 1,
store_masks, impute 'previous', start_time 'zero', end = the window): a slow, obvious oracle
for `scehr.schemas.tensorize.discretize` and the baseline of the tensorize benchmark.
"""

from __future__ import annotations

import numpy as np

from scehr.schemas.featureset import FeatureSet
from scehr.schemas.tensorize import Observations

EPS = 1e-6


def discretize_rows(obs: Observations, fs: FeatureSet, end_hours: np.ndarray) -> np.ndarray:
    """[N, T, F] with T = max bins; rows of each stay visited in (time, input) order."""
    n_bins = [int(e / fs.timestep + 1.0 - EPS) for e in end_hours]
    n_t = max(max(n_bins, default=1), 1)
    out = np.zeros((obs.n_stays, n_t, fs.n_features), dtype=np.float32)
    rows_by_stay: list[list[int]] = [[] for _ in range(obs.n_stays)]
    for i in range(len(obs)):
        rows_by_stay[int(obs.stay[i])].append(i)
    begins, variables = fs.begins, fs.variables
    for s, rows in enumerate(rows_by_stay):
        rows.sort(key=lambda i: (obs.time[i], i))
        nb = max(n_bins[s], 1)
        value = [[None] * fs.n_channels for _ in range(nb)]
        for i in rows:
            t = obs.time[i]
            if t > end_hours[s] + EPS:
                continue
            b = int(t / fs.timestep - EPS)
            if b < 0 or b >= nb:
                continue
            value[b][int(obs.channel[i])] = obs.value[i]
        prev: list[float | None] = [None] * fs.n_channels
        for b in range(nb):
            for c, var in enumerate(variables):
                observed = value[b][c] is not None
                if observed:
                    prev[c] = value[b][c]
                v = prev[c] if prev[c] is not None else var.normal_float
                if var.is_categorical:
                    out[s, b, begins[c] + int(v)] = 1.0
                else:
                    out[s, b, begins[c]] = v
                out[s, b, fs.n_value_columns + c] = float(observed)
    return out
