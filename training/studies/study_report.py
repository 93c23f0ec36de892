"""Figures and tables of a finished `scehr study` from its summary and run folders.

- `embedding_report`: per method, the embedding geometry SCR-type terms are meant to change
  (class separation, intra-class spread, linear-probe AUROC;
  `training/studies/embedding_quality.py`),
  averaged over the seeds, and one grid of t-SNE panels (the first seed's test embeddings with
  the anchors u, v of the drawn label), so the methods can be compared on one page.
- `plot_by_prevalence`: test AUROC (95% CI) against the training prevalence, one line per
  series, for studies whose methods set `train_prevalence` (the imbalance study).
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from scehr.training.data.writer import write_json
from scehr.training.plots import _figure, _save, tsne_with_anchors
from scehr.training.studies.embedding_quality import embedding_quality, embedding_quality_multilabel
from scehr.training.studies.experiments import _md_table


def _run_quality(run_dir: Path) -> dict[str, Any]:
    """Embedding quality of one run: probe fitted on its training embeddings, scored on test."""
    from scehr.training.evaluate import load_predictions

    preds = load_predictions(run_dir)
    if "train" not in preds or "z" not in preds["train"]:
        raise ValueError(f"{run_dir}: predictions.npz has no training embeddings (train_z); "
                         "rerun the cell with this version")
    tr, te = preds["train"], preds["test"]
    if tr["y"].shape[1] == 1:
        return embedding_quality(tr["z"], tr["y"][:, 0], te["z"], te["y"][:, 0])
    q = embedding_quality_multilabel(tr["z"], tr["y"], te["z"], te["y"])
    return {"separation": q["mean_separation"],
            "linear_probe_auroc": q["mean_linear_probe_auroc"]}


def _mean_sd(values: list[float | None]) -> dict[str, float | None]:
    ok = [v for v in values if v is not None and math.isfinite(v)]
    if not ok:
        return {"mean": None, "sd": None, "n": 0}
    return {"mean": float(np.mean(ok)), "sd": float(np.std(ok, ddof=1)) if len(ok) > 1 else 0.0,
            "n": len(ok)}


def _tsne_panel(run_dir: Path, label: int, max_points: int, seed: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from scehr.training.evaluate import load_predictions
    from scehr.training.fit import load_checkpoint

    test = load_predictions(run_dir)["test"]
    model, _, _ = load_checkpoint(run_dir / "model.pt")
    u, v = model.head.anchors()
    return tsne_with_anchors(test["z"], test["y"][:, label],
                             {"u": u[label].numpy(), "v": v[label].numpy()},
                             max_points=max_points, seed=seed)


def embedding_report(summary: dict[str, Any], out: Path, label: int = 0,
                     max_points: int = 1500, cols: int = 4) -> dict[str, Any]:
    """Per-method embedding metrics (mean ± sd over seeds) and a t-SNE grid of the first seed;
    writes `<out>/embeddings.json`, `embeddings.md` and `embeddings_tsne.png`."""
    rows: dict[str, Any] = {}
    panels: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for method, r in summary["methods"].items():
        per_seed = [_run_quality(Path(d)) for d in r["run_dirs"]]
        rows[method] = {
            "separation": _mean_sd([q["separation"] for q in per_seed]),
            "linear_probe_auroc": _mean_sd([q["linear_probe_auroc"] for q in per_seed]),
            "test_headline": _mean_sd(r["per_seed_test_headline"]),
            "per_seed": per_seed,
        }
        if "intra_class_spread" in per_seed[0]:
            for cls in ("positive", "negative"):
                rows[method][f"spread_{cls}"] = _mean_sd(
                    [q["intra_class_spread"][cls] for q in per_seed])
        panels[method] = _tsne_panel(Path(r["run_dirs"][0]), label, max_points, seed=0)
    report = {"title": summary["title"], "seeds": summary["seeds"], "tsne_label": label,
              "tsne_points": max_points, "methods": rows}
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "embeddings.json", report)
    (out / "embeddings.md").write_text(embedding_markdown(report))
    plot_tsne_grid(out / "embeddings_tsne.png", panels, cols=cols,
                   title=f"{summary['title']}: test embeddings (seed {summary['seeds'][0]}, "
                         f"{max_points} stays) with anchors u (★) and v (✕)")
    return report


def _ms(d: dict[str, float | None]) -> str:
    return "n/a" if d["mean"] is None else f"{d['mean']:.3f} ± {d['sd']:.3f}"


def embedding_markdown(report: dict[str, Any]) -> str:
    """Table: one row per method, mean ± sd over seeds."""
    binary = "spread_positive" in next(iter(report["methods"].values()))
    head = ["method", "separation ‖ĉ₁ − ĉ₀‖", *(["spread (pos)", "spread (neg)"] if binary
                                                   else []),
            "linear-probe AUROC", "model test " + ("AUROC" if binary else "headline")]
    rows = [[m, _ms(r["separation"]),
             *([_ms(r["spread_positive"]), _ms(r["spread_negative"])] if binary else []),
             _ms(r["linear_probe_auroc"]), _ms(r["test_headline"])]
            for m, r in report["methods"].items()]
    return (f"Test embeddings, mean ± sd over seeds {report['seeds']}; separation and spread "
            "on L2-normalised embeddings; the probe is a logistic regression fitted on the "
            "training embeddings" + ("" if binary else " (per label, then averaged)") + ".\n\n"
            + _md_table(head, rows) + "\n")


def plot_tsne_grid(path: Path, panels: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                   cols: int = 4, title: str = "") -> Path:
    """One small t-SNE panel per method: negatives grey, positives red, anchors u ★ and v ✕."""
    n = len(panels)
    rows = math.ceil(n / cols)
    fig = _figure(figsize=(3.0 * cols, 2.8 * rows + 0.4))
    for i, (name, (pts, yy, anc)) in enumerate(panels.items()):
        ax = fig.add_subplot(rows, cols, i + 1)
        neg, pos = yy == 0, yy == 1
        ax.scatter(pts[neg, 0], pts[neg, 1], s=2, c="0.65", alpha=0.5, lw=0)
        ax.scatter(pts[pos, 0], pts[pos, 1], s=3, c="tab:red", alpha=0.7, lw=0)
        ax.scatter(anc[0, 0], anc[0, 1], s=160, marker="*", c="darkred", edgecolors="white")
        ax.scatter(anc[1, 0], anc[1, 1], s=90, marker="X", c="black", edgecolors="white")
        ax.set_title(name, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def plot_by_prevalence(summary: dict[str, Any], path: Path, metric: str = "auroc") -> Path | None:
    """Test `metric` (95% CI) vs training prevalence (log x), one line per series; None when no
    method sets `train_prevalence`."""
    series: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    for r in summary["methods"].values():
        prev = r["spec"].get("train_prevalence")
        if prev is not None:
            series.setdefault(r["series"], []).append((float(prev), r["test"][metric]))
    if not series:
        return None
    fig = _figure(figsize=(6.0, 4.2))
    ax = fig.add_subplot()
    for k, (name, pts) in enumerate(series.items()):
        pts.sort(key=lambda t: t[0])
        x = np.array([p for p, _ in pts]) * (1.0 + 0.04 * (k - len(series) / 2))  # dodge
        v = np.array([c["value"] for _, c in pts])
        err = np.array([[c["value"] - c["low"], c["high"] - c["value"]] for _, c in pts]).T
        ax.errorbar(x, v, yerr=err, marker="o", ms=4, capsize=3, label=name)
    ticks = sorted({p for pts in series.values() for p, _ in pts})
    ax.set_xscale("log")
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set(xlabel="training prevalence of positives (log scale)",
           ylabel=f"test {metric.upper()} (95% CI, seed mean)")
    ax.set_title(textwrap.fill(summary["title"], 60), fontsize=9)
    ax.legend(fontsize="small")
    return _save(fig, path)
