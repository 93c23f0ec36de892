"""The drift references of a served model, fitted at export: the training split's observed
values per variable in fixed bins and the validation risks in decile bins, counted exactly as
the service counts served stays (`scehr.schemas.profile`), so monitoring compares like with like.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from scehr.schemas.manifest import Histogram
from scehr.schemas.profile import Bins, bin_index, decile_edges, value_counts
from scehr.training.config import TrainConfig


def histogram(values: np.ndarray, edges: list[float]) -> Histogram:
    counts = np.bincount(bin_index(values, np.asarray(edges)), minlength=len(edges) + 1)
    return Histogram(edges=edges, fractions=(counts / max(len(values), 1)).round(6).tolist(),
                     n=len(values))


def risk_reference(risk: np.ndarray) -> Histogram:
    """Validation risks in bins cut at their deciles (the served-risk drift baseline)."""
    edges = np.unique(np.round(np.quantile(risk, np.linspace(0, 1, 11)[1:-1]), 6)).tolist()
    return histogram(risk, edges)


def value_reference(cfg: dict[str, Any], data: Any = None) -> dict[str, Histogram]:
    """The training split's observed hourly values per variable in fixed bins (the PSI
    baseline), counted with `scehr.schemas.profile` exactly as the service counts served stays.

    Reads `data` (`scehr.training.fit.prepare` of the run's config), else re-reads the run's data
    folder (cached arrays) with the run's own split rules; empty when that folder is gone."""
    data = data if data is not None else prepared_data(cfg)
    if data is None:
        return {}
    train = data.raw["train"]
    fs = TrainConfig(**cfg).features()
    bins = Bins.of(fs, decile_edges(train.x, train.lengths, fs))
    counts = value_counts(train.x, train.lengths, fs, bins).sum(axis=0)  # [V, width]
    out = {}
    for k, var in enumerate(fs.variables):
        nb = bins.n_bins(fs, k)
        c = counts[k, :nb]
        if c.sum() == 0:
            continue
        edges = bins.edges[k]
        out[var.id] = Histogram(edges=[] if edges is None else edges.tolist(),
                                fractions=(c / c.sum()).round(6).tolist(), n=int(c.sum()))
    return out


def prepared_data(cfg: dict[str, Any]) -> Any:
    """The run's splits as training prepared them (`scehr.training.fit.prepare`), in memory even
    for a streamed run (the same splits and statistics; the exact deciles and the fairness
    audit read whole splits); None when its data folder is gone."""
    from scehr.training.fit import prepare

    if not Path(cfg["data"]).is_dir():
        return None
    return prepare(TrainConfig(**{**cfg, "stream": False}))
