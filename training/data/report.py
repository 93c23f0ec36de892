"""Plain-text tables for the data commands: conversion summaries and `inspect`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from scehr.training.data.splits import SplitArrays


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns aligned on the widest cell; the first column left, the others right."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for k, r in enumerate(cells):
        parts = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:],
                                                                     strict=True)]
        lines.append("  ".join(parts).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(c: Any) -> str:
    if isinstance(c, float | np.floating):
        return f"{c:.4g}" if abs(c) < 1e4 else f"{c:.0f}"
    return str(c)


def pct(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def cleaning_table(columns: Mapping[str, Mapping[str, Mapping[str, int]]]) -> str:
    """Per channel, implausible/dropped/clipped counts for each named column (e.g. each set);
    channels in the order of the first column's counts."""
    first = next(iter(columns.values()), {"dropped": {}})
    ids = list(first["dropped"])
    kinds = ("implausible", "dropped", "clipped")
    headers = ["channel"] + [f"{name} {k}" for name in columns for k in kinds]
    rows: list[list[Any]] = []
    for cid in ids:
        row: list[Any] = [cid]
        for c in columns.values():
            row += [c.get(k, {}).get(cid, 0) for k in kinds]
        rows.append(row)
    total: list[Any] = ["total"]
    for c in columns.values():
        total += [sum(c.get(k, {}).values()) for k in kinds]
    rows.append(total)
    return table(headers, rows)


def missingness(a: SplitArrays) -> np.ndarray:
    """Per channel, the share of valid hourly bins with no observation."""
    fs = a.feature_set
    if len(a) == 0:
        return np.ones(fs.n_channels)
    valid = np.arange(a.x.shape[1])[None, :] < a.lengths[:, None]
    masks = a.x[..., fs.n_value_columns:][valid]
    return 1.0 - masks.mean(axis=0)


def inspect_task(task: str, arrays: Mapping[str, SplitArrays]) -> str:
    """Counts, prevalence, coverage and missingness of one task's splits."""
    out = []
    rows = []
    for split, a in arrays.items():
        prev = a.prevalence
        prev_s = pct(float(prev[0])) if len(prev) == 1 else (
            f"mean {pct(float(prev.mean()))} (min {pct(float(prev.min()))}, "
            f"max {pct(float(prev.max()))})")
        miss = np.isnan(a.static_raw).mean(axis=0) if len(a) else np.zeros(2)
        rows.append([split, len(a), prev_s, f"{a.end_hours.mean():.1f}" if len(a) else "-",
                     pct(float(miss[0])), pct(float(miss[1])), a.split_source])
    out.append(table(["split", "stays", "prevalence", "mean hours", "age missing",
                      "sex missing", "split from"], rows))
    first = next(iter(arrays.values()))
    ids = [v.id for v in first.feature_set.variables]
    miss = {s: missingness(a) for s, a in arrays.items()}
    headers = ["channel", *(f"cov {s}" for s in arrays), *(f"miss {s}" for s in arrays),
               *(f"drop/clip {s}" for s in arrays)]
    rows = []
    for i, cid in enumerate(ids):
        rows.append([cid, *(pct(float(a.coverage[i])) for a in arrays.values()),
                     *(pct(float(miss[s][i])) for s in arrays),
                     *(f"{int(a.dropped[i])}/{int(a.clipped[i])}" for a in arrays.values())])
    out.append("cov = stays with the channel observed; miss = hourly bins without it; "
               "drop/clip = values dropped / clipped on reading")
    out.append(table(headers, rows))
    if len(first.label_names) > 1:
        rows = [[name, *(pct(float(a.prevalence[j])) for a in arrays.values())]
                for j, name in enumerate(first.label_names)]
        out.append(table(["label", *arrays], rows))
    return "\n\n".join(out)
