"""Evaluation figures saved as PNG files (matplotlib Agg, no pyplot state).

Figures are built with `matplotlib.figure.Figure` on an Agg canvas rather than
pyplot: nothing global is touched, nothing is shown, and nothing leaks between
calls (safe in tests, threads and headless training jobs). Every function takes
the output path first and returns it. `models` arguments map a legend name to
(y, p); 2-D (multi-label) inputs are pooled, i.e. micro-averaged.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from numpy.typing import ArrayLike
from sklearn.manifold import TSNE
from sklearn.metrics import precision_recall_curve, roc_curve

from scehr.training.bootstrap import format_ci
from scehr.training.calibration import expected_calibration_error, reliability_curve
from scehr.training.metrics import auprc, auroc, l2_normalize

Models = Mapping[str, tuple[ArrayLike, ArrayLike]]
CIs = Mapping[str, Mapping[str, Any]] | None
_DPI = 120


def _figure(figsize: tuple[float, float] = (6.0, 5.0), **kw: Any) -> Figure:
    fig = Figure(figsize=figsize, layout="constrained", **kw)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | Path) -> Path:
    """Write the PNG (creating parent folders) and release the figure's artists."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=_DPI, format="png")
    fig.clear()
    return out


def _flat(y: ArrayLike, p: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(y).ravel(), np.asarray(p, dtype=np.float64).ravel()


def _label(name: str, metric: str, value: float, ci: Mapping[str, Any] | None) -> str:
    """Legend text: 'name (AUROC 0.842 [0.820, 0.861])', CI only when given."""
    if ci is not None:
        return f"{name} ({metric} {format_ci(dict(ci))})"
    return f"{name} ({metric} {'n/a' if math.isnan(value) else f'{value:.3f}'})"


# ---------------------------------------------------------------- ranking curves
def plot_roc_curves(
    path: str | Path, models: Models, cis: CIs = None, title: str = "ROC curve"
) -> Path:
    """ROC curves of several models on one axes, AUROC (and CI) in the legend."""
    fig = _figure()
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=1, label="chance (AUROC 0.500)")
    for name, (y, p) in models.items():
        yy, pp = _flat(y, p)
        value = auroc(yy, pp)
        if math.isnan(value):
            continue  # single-class labels: no curve to draw
        fpr, tpr, _ = roc_curve(yy, pp)
        ax.plot(fpr, tpr, lw=1.5, label=_label(name, "AUROC", value, (cis or {}).get(name)))
    ax.set(xlabel="False positive rate (1 − specificity)", ylabel="True positive rate "
           "(sensitivity)", title=title, xlim=(0, 1), ylim=(0, 1.01))
    ax.legend(loc="lower right", fontsize="small")
    return _save(fig, path)


def plot_pr_curves(
    path: str | Path, models: Models, cis: CIs = None, title: str = "Precision-recall curve"
) -> Path:
    """PR curves with average precision in the legend and the prevalence baseline."""
    fig = _figure()
    ax = fig.add_subplot()
    baselines: set[float] = set()
    for name, (y, p) in models.items():
        yy, pp = _flat(y, p)
        value = auprc(yy, pp)
        if yy.size:
            baselines.add(round(float(np.mean(yy)), 4))
        if math.isnan(value):
            continue
        precision, recall, _ = precision_recall_curve(yy, pp)
        ax.step(recall, precision, where="post", lw=1.5,
                label=_label(name, "AUPRC", value, (cis or {}).get(name)))
    for prev in sorted(baselines):
        ax.axhline(prev, ls="--", c="grey", lw=1, label=f"prevalence {prev:.3f}")
    ax.set(xlabel="Recall (sensitivity)", ylabel="Precision (PPV)", title=title,
           xlim=(0, 1), ylim=(0, 1.01))
    ax.legend(loc="upper right", fontsize="small")
    return _save(fig, path)


# ---------------------------------------------------------------- calibration
def plot_reliability(
    path: str | Path, models: Models, n_bins: int = 10, title: str = "Reliability diagram"
) -> Path:
    """Observed rate vs mean prediction per bin (ECE in legend), histogram underneath."""
    fig = _figure(figsize=(6.0, 6.5))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.plot([0, 1], [0, 1], ls="--", c="grey", lw=1, label="perfect calibration")
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    for name, (y, p) in models.items():
        yy, pp = _flat(y, p)
        curve = reliability_curve(yy, pp, n_bins)
        ece = expected_calibration_error(yy, pp, n_bins)
        line = top.plot(curve["mean_predicted"], curve["observed_rate"], marker="o", lw=1.5,
                        label=f"{name} (ECE {ece:.3f})")[0]
        bottom.hist(pp, bins=edges, histtype="step", lw=1.5, color=line.get_color(), label=name)
    top.set(ylabel="Observed event rate", title=title, xlim=(0, 1), ylim=(0, 1.01))
    top.legend(loc="upper left", fontsize="small")
    bottom.set(xlabel="Predicted probability", ylabel="Count")
    return _save(fig, path)


# ---------------------------------------------------------------- training history
def _read_history(history: Sequence[Mapping[str, Any]] | str | Path) -> list[dict[str, float]]:
    """Rows as floats (blank or non-numeric cells become NaN)."""
    if isinstance(history, str | Path):
        with open(history, newline="") as fh:
            history = list(csv.DictReader(fh))

    def num(v: Any) -> float:
        try:
            return float(v)
        except (TypeError, ValueError):
            return float("nan")

    return [{k: num(v) for k, v in row.items()} for row in history]


def plot_learning_curves(
    path: str | Path,
    history: Sequence[Mapping[str, Any]] | str | Path,
    loss_keys: Sequence[str] | None = None,
    metric_key: str | None = None,
    best_epoch: int | None = None,
    mode: str = "max",
    title: str = "Learning curves",
) -> Path:
    """Losses (left axis) and a validation metric (right axis), best epoch marked.

    Defaults: every column ending in "loss", and the first "val_*" column that is
    not a loss; best epoch = arg-`mode` of that metric unless given.
    """
    rows = _read_history(history)
    if not rows:
        raise ValueError("empty training history")
    keys = list(rows[0])
    epochs = np.array([r.get("epoch", i + 1) for i, r in enumerate(rows)], dtype=float)
    if loss_keys is None:
        loss_keys = [k for k in keys if k.endswith("loss")]
    if metric_key is None:
        metric_key = next((k for k in keys if k.startswith("val_") and not k.endswith("loss")),
                          None)
    fig = _figure(figsize=(7.0, 4.5))
    ax = fig.add_subplot()
    handles = []
    for k in loss_keys:
        handles += ax.plot(epochs, [r.get(k, np.nan) for r in rows], lw=1.5, label=k)
    ax.set(xlabel="Epoch", ylabel="Loss", title=title)
    if metric_key is not None:
        metric = np.array([r.get(metric_key, np.nan) for r in rows], dtype=float)
        ax2 = ax.twinx()
        handles += ax2.plot(epochs, metric, c="tab:green", marker=".", lw=1.5, label=metric_key)
        ax2.set_ylabel(metric_key)
        if best_epoch is None and np.isfinite(metric).any():
            i = int(np.nanargmax(metric) if mode == "max" else np.nanargmin(metric))
            best_epoch = int(epochs[i])
        if best_epoch is not None:
            i = int(np.argmin(np.abs(epochs - best_epoch)))
            handles.append(ax.axvline(best_epoch, ls="--", c="grey", lw=1,
                                      label=f"best epoch {best_epoch} "
                                            f"({metric_key} {metric[i]:.3f})"))
            ax2.plot([epochs[i]], [metric[i]], marker="*", ms=14, c="tab:red")
    ax.legend(handles=handles, loc="best", fontsize="small")
    return _save(fig, path)


# ---------------------------------------------------------------- embeddings
def tsne_with_anchors(
    Z: ArrayLike,
    y: ArrayLike,
    anchors: Mapping[str, ArrayLike] | None = None,
    max_points: int = 2000,
    seed: int = 0,
    perplexity: float = 30.0,
    max_iter: int = 1000,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(points [n, 2], their labels [n], anchors [A, 2]) of one t-SNE run over the (subsampled)
    normalised embeddings and the normalised anchors, so anchors land among their neighbours."""
    Zn = l2_normalize(Z)
    yy = np.asarray(y).ravel()
    if len(Zn) != len(yy):
        raise ValueError(f"{len(Zn)} embeddings but {len(yy)} labels")
    rng = np.random.default_rng(seed)
    if len(Zn) > max_points:
        keep = np.sort(rng.choice(len(Zn), size=max_points, replace=False))
        Zn, yy = Zn[keep], yy[keep]
    anchor_names = list(anchors or {})
    A = (l2_normalize(np.stack([np.asarray(anchors[k], dtype=float).ravel()
                                for k in anchor_names]))
         if anchor_names else np.empty((0, Zn.shape[1])))
    X = np.vstack([Zn, A])
    perp = float(min(perplexity, max(1.0, (len(X) - 1) / 3)))
    XY = TSNE(n_components=2, perplexity=perp, init="pca", random_state=seed,
              max_iter=max_iter).fit_transform(X)
    return XY[: len(Zn)], yy, XY[len(Zn):]


def plot_embedding_tsne(
    path: str | Path,
    Z: ArrayLike,
    y: ArrayLike,
    anchors: Mapping[str, ArrayLike] | None = None,
    *,
    class_names: Mapping[Any, str] | None = None,
    title: str = "t-SNE of embeddings",
    **tsne: Any,
) -> Path:
    """2-D t-SNE of normalised embeddings coloured by label, anchors as large markers.

    `anchors` maps a name (e.g. "u (positive anchor)") to a [D] vector; `tsne_with_anchors`
    embeds them in the same t-SNE run as the embeddings, so they land where their neighbours
    are, with its options in `tsne` (max_points, seed, perplexity, max_iter).
    """
    anchor_names = list(anchors or {})
    pts, yy, anc = tsne_with_anchors(Z, y, anchors, **tsne)

    fig = _figure(figsize=(6.5, 5.5))
    ax = fig.add_subplot()
    names = dict(class_names or {0: "negative", 1: "positive"})
    for cls in np.unique(yy):
        m = yy == cls
        ax.scatter(pts[m, 0], pts[m, 1], s=6, alpha=0.6,
                   label=f"{names.get(cls.item(), str(cls))} (n={int(m.sum())})")
    markers, colours = ["*", "X", "P", "D"], ["red", "blue", "black", "purple"]
    for j, name in enumerate(anchor_names):
        ax.scatter(anc[j, 0], anc[j, 1], s=320, marker=markers[j % 4], c=colours[j % 4],
                   edgecolors="white", linewidths=1.2, zorder=5, label=f"anchor {name}")
    ax.set(xlabel="t-SNE 1", ylabel="t-SNE 2", title=title)
    ax.legend(loc="best", fontsize="small", markerscale=1.0)
    return _save(fig, path)
