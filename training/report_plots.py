"""The figures of an evaluation report (`scehr evaluate`, `scehr recalibrate`), from the
report's own tables: what is drawn is what report.json holds.

Each function takes the output path first and writes a PNG (matplotlib Agg, no pyplot state,
as `scehr.training.plots`); `models` map a legend name (e.g. "shipped 1.3.1") to that model's
block of the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from scehr.training.plots import _figure, _save

Rows = Sequence[Mapping[str, Any]]
#: One colour per model, in the order given (shipped, then the one compared with it).
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:purple")


def plot_reliability_bands(path: str | Path, models: Mapping[str, Rows],
                           title: str = "Reliability") -> Path:
    """Observed outcome rate against mean risk per risk group (equal-count groups), with the
    95 % Wilson interval of the observed rate as a band; the diagonal is perfect calibration.
    Each row: mean_risk, observed_rate, low, high, n."""
    fig = _figure(figsize=(6.0, 5.5))
    ax = fig.add_subplot()
    top = 0.05
    for (name, rows), colour in zip(models.items(), COLOURS, strict=False):
        if not rows:
            continue
        x = np.array([r["mean_risk"] for r in rows])
        obs = np.array([r["observed_rate"] for r in rows])
        lo, hi = np.array([r["low"] for r in rows]), np.array([r["high"] for r in rows])
        ax.fill_between(x, lo, hi, color=colour, alpha=0.18, lw=0)
        ax.plot(x, obs, marker="o", ms=4, lw=1.5, color=colour,
                label=f"{name} ({len(rows)} groups of ~{int(np.median([r['n'] for r in rows]))}"
                " stays; band: 95 % CI)")
        top = max(top, float(x.max()), float(np.nanmax(hi)))
    top = min(1.0, top * 1.05)
    ax.plot([0, top], [0, top], ls="--", c="grey", lw=1, label="perfect calibration")
    ax.set(xlabel="Mean served risk in the group", ylabel="Observed outcome rate",
           title=title, xlim=(0, top), ylim=(0, top))
    ax.legend(loc="upper left", fontsize="small")
    return _save(fig, path)


def plot_risk_by_outcome(path: str | Path, y: ArrayLike, risk: ArrayLike,
                         thresholds: Mapping[str, float], title: str = "Risk by outcome"
                         ) -> Path:
    """Histograms of the served risk of stays with and without the outcome (log risk axis,
    share of each group per bin), the named operating points as vertical lines."""
    yy = np.asarray(y).ravel() > 0.5
    rr = np.clip(np.asarray(risk, dtype=np.float64).ravel(), 1e-4, 1.0)
    low = 10 ** np.floor(np.log10(rr.min())) if rr.size else 1e-4
    edges = np.geomspace(low, 1.0, 41)
    fig = _figure(figsize=(6.5, 4.5))
    ax = fig.add_subplot()
    for mask, name, colour in ((~yy, "stays without the outcome", "tab:blue"),
                               (yy, "stays with the outcome", "tab:red")):
        if mask.any():
            weights = np.full(int(mask.sum()), 1.0 / mask.sum())
            ax.hist(rr[mask], bins=edges, weights=weights, histtype="stepfilled", alpha=0.35,
                    color=colour, edgecolor=colour, lw=1.2,
                    label=f"{name} (n={int(mask.sum())})")
    for (name, t), style in zip(thresholds.items(), ("--", "-.", ":", "-"), strict=False):
        ax.axvline(t, c="black", ls=style, lw=1, label=f"{name} (risk >= {t:.3f})")
    ax.set_xscale("log")
    ax.set(xlabel="Served risk (log scale)", ylabel="Share of the group's stays", title=title,
           xlim=(low, 1.0))
    ax.legend(loc="upper left", fontsize="small")
    return _save(fig, path)


def plot_coverage_by_decile(path: str | Path, models: Mapping[str, Rows], level: float,
                            title: str = "Interval coverage by risk decile") -> Path:
    """Share of stays whose true outcome is in their served outcome set, per decile of risk
    (bars), and among the stays with the outcome (markers); the line is the nominal level.
    Each row: decile, events, coverage, coverage_with_outcome (None: no such stay)."""
    fig = _figure(figsize=(6.5, 5.0))
    ax = fig.add_subplot()
    k = max(len(models), 1)
    width = 0.8 / k
    for j, ((name, rows), colour) in enumerate(zip(models.items(), COLOURS, strict=False)):
        x = np.array([r["decile"] for r in rows], dtype=np.float64) + (j - (k - 1) / 2) * width
        ax.bar(x, [r["coverage"] for r in rows], width=width, color=colour, alpha=0.6,
               label=f"{name}: all stays")
        ev = [(xi, r["coverage_with_outcome"]) for xi, r in zip(x, rows, strict=True)
              if r["coverage_with_outcome"] is not None]
        if ev:
            ax.plot(*zip(*ev, strict=True), ls="none", marker="v", ms=7, color=colour,
                    markeredgecolor="black", label=f"{name}: stays with the outcome")
    ax.axhline(level, c="black", ls="--", lw=1, label=f"nominal level {level:.0%}")
    rows = next(iter(models.values()), [])
    ax.set_xticks([r["decile"] for r in rows],
                  [f"{r['decile']}\n({r['events']})" for r in rows])
    ax.set(xlabel="Risk decile, 1 = lowest risks (stays with the outcome)",
           ylabel="Coverage", title=title, ylim=(0, 1.05))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.24), ncol=2, fontsize="small")
    return _save(fig, path)


def plot_point_rates(path: str | Path, models: Mapping[str, Rows],
                     title: str = "Alerts by operating point") -> Path:
    """Per named operating point: alert rate, sensitivity and PPV with their 95 % CIs, one
    panel each; each row: name, alert_rate, sensitivity, ppv (bootstrap dicts)."""
    names = list(dict.fromkeys(r["name"] for rows in models.values() for r in rows))
    fig = _figure(figsize=(9.0, 3.8))
    axes = fig.subplots(1, 3, sharey=True)
    k = max(len(models), 1)
    width = 0.8 / k
    for ax, (key, label) in zip(axes, (("alert_rate", "Alert rate"),
                                       ("sensitivity", "Sensitivity"), ("ppv", "PPV")),
                                strict=True):
        for j, ((name, rows), colour) in enumerate(zip(models.items(), COLOURS, strict=False)):
            by = {r["name"]: r[key] for r in rows}
            xs, vals, err = [], [], [[], []]
            for i, point in enumerate(names):
                ci = by.get(point)
                if not ci or ci.get("value") is None:
                    continue
                v = ci["value"]
                xs.append(i + (j - (k - 1) / 2) * width)
                vals.append(v)
                err[0].append(v - (ci["low"] if ci.get("low") is not None else v))
                err[1].append((ci["high"] if ci.get("high") is not None else v) - v)
            ax.bar(xs, vals, width=width, color=colour, alpha=0.7, yerr=err, capsize=3,
                   label=name)
        ax.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names],
                      fontsize="small")
        ax.set(title=label, ylim=(0, 1.0))
    axes[0].legend(loc="upper right", fontsize="x-small")
    fig.suptitle(title)
    return _save(fig, path)
