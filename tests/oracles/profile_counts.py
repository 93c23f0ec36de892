"""Per-variable value counts, one variable at a time: the oracle for the vectorised
`scehr.schemas.profile.value_counts` (this is how it was computed before)."""

from __future__ import annotations

import numpy as np

from scehr.schemas.featureset import FeatureSet
from scehr.schemas.profile import Bins, bin_index, observed_mask


def value_counts_by_variable(x: np.ndarray, lengths: np.ndarray, fs: FeatureSet,
                             bins: Bins) -> np.ndarray:
    """[N, V, width] per stay and variable: observed hours per value bin (int32)."""
    n = x.shape[0]
    seen = observed_mask(x, lengths, fs)
    out = np.zeros((n, fs.n_channels, bins.width), dtype=np.int32)
    for k, (var, begin) in enumerate(zip(fs.variables, fs.begins, strict=True)):
        stay, hour = np.nonzero(seen[:, :, k])
        if stay.size == 0:
            continue
        if var.is_categorical:
            b = x[stay, hour, begin : begin + len(var.categories)].argmax(axis=1)
        else:
            edges = bins.edges[k]
            assert edges is not None
            b = bin_index(x[stay, hour, begin].astype(np.float64), edges)
        np.add.at(out, (stay, k, b), 1)
    return out
