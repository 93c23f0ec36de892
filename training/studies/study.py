"""`scehr study CONFIG`: many methods x seeds on one task, resumable, with one summary table.

A study file (TOML, one per study in `configs/`) names a base training config, overrides for
every cell, the seeds, the reference method (BCE) and the methods, each a set of config keys
with an optional `grid` of values to choose from:

    base = "paper_mortality.toml"          # relative to the study file
    seeds = [0, 1, 2]
    reference = "bce"
    [overrides]                            # every cell
    epochs = 30
    [methods.cbce_scr]
    loss = "cbce"
    [methods.cbce_scr.grid]                # chosen on validation, on the first seed
    lam = [0.002, 0.007]

Selection: each grid point trains on the first seed; the point with the best validation
headline metric is kept and trained on the other seeds (the test set plays no part). Every cell
is a run folder `<study>/<method>/<point>-s<seed>`; a cell whose `metrics.json` exists is read
back, a cell stopped by Ctrl-C resumes from its checkpoint, so rerunning the command continues.

The summary: per method, test metrics averaged over seeds with 95% bootstrap CIs over test
stays (every replicate averages the seeds on the same resample), and the paired bootstrap
difference of that seed average against the reference method.
"""

from __future__ import annotations

import itertools
import json
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scehr.training.bootstrap import bootstrap_ci, format_ci, paired_bootstrap_diff
from scehr.training.config import TrainConfig, load_config
from scehr.training.data.writer import write_json
from scehr.training.fit import RESUME_FILE
from scehr.training.metrics import (
    auprc,
    auroc,
    balanced_accuracy,
    macro_auroc,
    micro_auroc,
    min_se_ppv,
)
from scehr.training.progress import Progress
from scehr.training.run import train_run
from scehr.training.studies.experiments import DataCache, _md_table, ensure_run

STUDY_KEYS = ("base", "seeds", "reference", "overrides", "methods", "n_boot", "title")
#: Keys of a method table that are not config keys: its grid, the method it is compared with
#: (default: the study's `reference`), and its series (default: its name): methods of one
#: series that differ in `train_prevalence` are one line of the prevalence plot.
METHOD_KEYS = ("grid", "reference", "series")


@dataclass
class Cell:
    method: str
    point: dict[str, Any]
    seed: int
    cfg: TrainConfig


@dataclass
class Study:
    path: Path
    base: Path
    seeds: list[int]
    reference: str
    overrides: dict[str, Any]
    methods: dict[str, dict[str, Any]]
    n_boot: int
    title: str

    def grid(self, method: str) -> list[dict[str, Any]]:
        """Every grid point of a method ({} when it has no grid)."""
        g = self.methods[method].get("grid", {})
        keys = list(g)
        return [dict(zip(keys, vals, strict=True)) for vals in itertools.product(
            *(g[k] for k in keys))] or [{}]


def load_study(path: str | Path) -> Study:
    """Read and check a study file (errors name the key and the rule)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"study file {p} does not exist")
    raw = tomllib.loads(p.read_text())
    unknown = sorted(set(raw) - set(STUDY_KEYS))
    if unknown:
        raise ValueError(f"{p}: unknown study keys {unknown}; known: {list(STUDY_KEYS)}")
    methods = raw.get("methods") or {}
    if not methods:
        raise ValueError(f"{p}: [methods.<name>] tables are required")
    reference = raw.get("reference", "bce")
    if reference not in methods:
        raise ValueError(f"{p}: reference {reference!r} is not one of the methods "
                         f"{list(methods)}")
    seeds = raw.get("seeds", [0])
    if not seeds or not all(isinstance(s, int) for s in seeds):
        raise ValueError(f"{p}: seeds must be a non-empty list of integers")
    for name, m in methods.items():
        if m.get("reference", reference) not in methods:
            raise ValueError(f"{p}: methods.{name}.reference {m['reference']!r} is not one of "
                             f"the methods {list(methods)}")
        for key, values in m.get("grid", {}).items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"{p}: methods.{name}.grid.{key} must be a non-empty list")
    return Study(p, (p.parent / raw.get("base", "")).resolve() if raw.get("base") else p,
                 list(seeds), reference, dict(raw.get("overrides", {})), methods,
                 int(raw.get("n_boot", 1000)), str(raw.get("title", p.stem)))


def _apply(values: dict[str, Any], point: dict[str, Any]) -> dict[str, Any]:
    """Set dotted keys (`pretrain.gamma`, `regularizers.supcon_krandom.weight`) of a config."""
    out = json.loads(json.dumps(values))
    for key, value in point.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def point_name(point: dict[str, Any]) -> str:
    return "-".join(f"{k.split('.')[-1]}{v:g}" if isinstance(v, float) else
                    f"{k.split('.')[-1]}{v}" for k, v in point.items()) or "default"


def cell_config(study: Study, method: str, point: dict[str, Any], seed: int, out: Path,
                data: str | None) -> TrainConfig:
    """The method's config for one grid point and seed, in its cell folder."""
    base = load_config(study.base if study.base != study.path else None)
    values = {**base.to_dict(), **study.overrides}
    spec = {k: v for k, v in study.methods[method].items() if k not in METHOD_KEYS}
    values = _apply({**values, **spec}, point)
    values.update(seed=seed, out=str(out / method / f"{point_name(point)}-s{seed}"),
                  progress=False)
    if data:
        values["data"] = data
    if not values.get("data"):
        raise ValueError("the study needs data: give --data or `data` in [overrides]")
    return TrainConfig(**values)


def run_cell(cfg: TrainConfig, cache: DataCache) -> tuple[dict[str, Any], bool]:
    """(metrics, trained_now): read back a finished cell, resume a stopped one, or train it."""
    out = Path(cfg.out)
    if (out / "metrics.json").is_file():
        return ensure_run(cfg, cache, echo=False)
    resume = (out / RESUME_FILE).is_file()
    return train_run(cfg, cache.get(cfg), resume=resume, echo=False), True


def run_study(path: str | Path, out: Path | None = None, data: str | None = None,
              echo: Callable[[str], None] = print,
              methods: list[str] | None = None, embeddings: bool = False
              ) -> dict[str, Any] | None:
    """Train (or read back) every cell, choose each method's point on validation, summarize;
    writes `<out>/summary.json` and `<out>/summary.md` and returns the summary.

    `methods` trains only those methods' cells and writes no summary (None): a study split
    over several processes (each its own methods; no two share a cell), then read back whole
    by a run without `methods`. `embeddings` adds the embedding study of every method
    (`training/studies/study_report.py`); a study whose methods set `train_prevalence` also gets
    `<out>/by_prevalence.png`."""
    study = load_study(path)
    if methods:
        unknown = sorted(set(methods) - set(study.methods))
        if unknown:
            raise ValueError(f"--methods {unknown} are not methods of {study.path}: "
                             f"{list(study.methods)}")
        study.methods = {m: v for m, v in study.methods.items() if m in methods}
    out = Path(out) if out else Path("runs") / f"study-{study.path.stem}"
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    first, rest = study.seeds[0], study.seeds[1:]
    total = sum(len(study.grid(m)) for m in study.methods) + len(rest) * len(study.methods)
    progress, cache = Progress(total), DataCache()
    runs: dict[str, dict[int, dict[str, Any]]] = {m: {} for m in study.methods}
    chosen: dict[str, dict[str, Any]] = {}
    echo(f"study {study.title}: {len(study.methods)} methods, seeds {study.seeds}, "
         f"{total} runs -> {out}")
    for method in study.methods:  # grid points on the first seed; the best on validation
        scored = []
        for point in study.grid(method):
            cfg = cell_config(study, method, point, first, out, data)
            t0 = time.perf_counter()
            metrics, trained = run_cell(cfg, cache)
            val = metrics["val"][metrics["val"]["headline"]]
            scored.append((val if val is not None else -np.inf, point, cfg.out, metrics))
            echo(progress.step(f"{method} {point_name(point)} seed {first}: val "
                               f"{metrics['val']['headline']} {_num(val)}",
                               time.perf_counter() - t0, trained))
        best = max(scored, key=lambda s: s[0])
        chosen[method] = best[1]
        runs[method][first] = {"run_dir": best[2], **best[3]}
    for seed in rest:
        for method in study.methods:
            cfg = cell_config(study, method, chosen[method], seed, out, data)
            t0 = time.perf_counter()
            metrics, trained = run_cell(cfg, cache)
            runs[method][seed] = {"run_dir": cfg.out, **metrics}
            echo(progress.step(f"{method} {point_name(chosen[method])} seed {seed}: val "
                               f"{metrics['val']['headline']} "
                               f"{_num(metrics['val'][metrics['val']['headline']])}",
                               time.perf_counter() - t0, trained))
    if methods:
        echo(f"trained {list(study.methods)}; no summary (rerun without --methods for it)")
        return None
    echo(f"summary: bootstrap ({study.n_boot} resamples) of every method's seed average "
         "and of its paired difference against the reference")
    summary = summarize_study(study, runs, chosen)
    summary["wall_seconds_this_invocation"] = time.perf_counter() - t_start
    write_json(out / "summary.json", summary)
    text = study_markdown(summary)
    (out / "summary.md").write_text(text)
    echo(text)
    from scehr.training.studies.study_report import embedding_report, plot_by_prevalence

    if plot_by_prevalence(summary, out / "by_prevalence.png"):
        echo(f"wrote {out / 'by_prevalence.png'}")
    if embeddings:
        t0 = time.perf_counter()
        embedding_report(summary, out)
        echo(f"embedding study ({time.perf_counter() - t0:.0f} s): {out / 'embeddings.md'}, "
             f"{out / 'embeddings_tsne.png'}\n\n" + (out / "embeddings.md").read_text())
    return summary


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def _load_test(run_dir: str) -> dict[str, np.ndarray]:
    with np.load(Path(run_dir) / "predictions.npz") as f:
        return {k: f[k] for k in ("test_y", "test_probability", "test_stays")}


def _seed_mean(fn: Callable[..., float], thresholds: list[float] | None = None
               ) -> Callable[[np.ndarray, np.ndarray], float]:
    """metric(y, P[..., s]) averaged over the seed columns s (the last axis) of P."""
    def mean(y: np.ndarray, p: np.ndarray) -> float:
        vals = [fn(y, p[..., s]) if thresholds is None else fn(y, p[..., s], thresholds[s])
                for s in range(p.shape[-1])]
        return float(np.mean(vals))
    return mean


def _strict_macro(y: np.ndarray, p: np.ndarray) -> float:
    """Macro AUROC that is undefined (NaN) on a resample missing a class of some label, so
    every replicate averages the same labels (as the acceptance comparison does)."""
    return macro_auroc(y, p, strict=True)


#: Metrics reported per task kind, and the ones compared against the reference.
BINARY_METRICS = ("auroc", "auprc", "min_se_ppv", "balanced_accuracy")
BINARY_DIFFS = ("auroc", "auprc")
MULTILABEL_METRICS = ("micro_auroc", "macro_auroc")


def _method_spec(study: Study, method: str) -> dict[str, Any]:
    return {k: v for k, v in study.methods[method].items() if k not in METHOD_KEYS}


def summarize_study(study: Study, runs: dict[str, dict[int, dict[str, Any]]],
                    chosen: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Seed-averaged test metrics with CIs and paired differences against the reference.

    Binary tasks: AUROC, AUPRC, min(Se, P+), balanced accuracy at the threshold each run chose
    on validation. Multi-label tasks: micro and macro AUROC over the labels with both classes
    in the test set (macro undefined on a resample that loses a class of one of them)."""
    y = stays = None
    probs: dict[str, np.ndarray] = {}
    for method, per_seed in runs.items():
        cols = []
        for seed in study.seeds:
            t = _load_test(per_seed[seed]["run_dir"])
            if stays is not None and not np.array_equal(t["test_stays"], stays):
                raise ValueError(f"{per_seed[seed]['run_dir']}: test stays differ from the "
                                 "other runs' (all cells must share the test split)")
            stays, y = t["test_stays"], t["test_y"]
            cols.append(t["test_probability"])
        probs[method] = np.stack(cols, axis=-1)  # [N, C, seeds]
    assert y is not None
    binary = y.shape[1] == 1
    keep = np.ones(y.shape[1], bool) if binary else y.min(axis=0) != y.max(axis=0)
    y = y[:, 0] if binary else y[:, keep]
    probs = {m: p[:, 0] if binary else p[:, keep] for m, p in probs.items()}
    diffs = BINARY_DIFFS if binary else MULTILABEL_METRICS
    rows: dict[str, Any] = {}
    fns_of: dict[str, dict[str, Callable[[np.ndarray, np.ndarray], float]]] = {}
    for method, per_seed in runs.items():
        seeds = [per_seed[s] for s in study.seeds]
        if binary:
            thresholds = [r["test_ci_binary"]["balanced_accuracy_threshold"] for r in seeds]
            fns = {"auroc": _seed_mean(auroc), "auprc": _seed_mean(auprc),
                   "min_se_ppv": _seed_mean(min_se_ppv),
                   "balanced_accuracy": _seed_mean(balanced_accuracy, thresholds)}
        else:
            fns = {"micro_auroc": _seed_mean(micro_auroc),
                   "macro_auroc": _seed_mean(_strict_macro)}
        row: dict[str, Any] = {
            "chosen": chosen[method], "grid": study.methods[method].get("grid", {}),
            "spec": _method_spec(study, method),
            "series": study.methods[method].get("series", method),
            "val_headline": [r["val"][r["val"]["headline"]] for r in seeds],
            "per_seed_test_headline": [r["test"][r["test"]["headline"]] for r in seeds],
            "best_epoch": [r["best_epoch"] for r in seeds],
            "wall_seconds": [r["wall_seconds"] for r in seeds],
            "run_dirs": [r["run_dir"] for r in seeds],
            "test": {k: bootstrap_ci(fn, y, probs[method], n_boot=study.n_boot)
                     for k, fn in fns.items()},
        }
        fns_of[method] = fns
        rows[method] = row
    for method, row in rows.items():
        ref = study.methods[method].get("reference", study.reference)
        if method != ref:
            row["reference"] = ref
            row["vs_reference"] = {
                k: paired_bootstrap_diff(fns_of[method][k], y, probs[method], probs[ref],
                                         n_boot=study.n_boot)
                for k in diffs}
    return {"title": study.title, "study_file": str(study.path), "seeds": study.seeds,
            "reference": study.reference, "n_boot": study.n_boot, "n_test": len(y),
            "test_prevalence": float(np.mean(y)) if binary else np.mean(y, axis=0).tolist(),
            "labels_evaluated": int(keep.sum()), "overrides": study.overrides,
            "methods": rows}


_LABELS = {"auroc": "test AUROC", "auprc": "test AUPRC", "min_se_ppv": "test min(Se,P+)",
           "balanced_accuracy": "test bal. acc.", "micro_auroc": "test micro-AUROC",
           "macro_auroc": "test macro-AUROC"}


def study_markdown(s: dict[str, Any]) -> str:
    """The summary table (numbers only; the reading is written by a person)."""
    first = next(iter(s["methods"].values()))
    metrics = list(first["test"])
    diffs = next((list(r["vs_reference"]) for r in s["methods"].values()
                  if "vs_reference" in r), [])
    short = {"auroc": "AUROC", "auprc": "AUPRC", "micro_auroc": "micro", "macro_auroc": "macro"}
    head = ["method", "chosen on val", "val " + ("AUROC" if "auroc" in metrics else "headline"),
            *[_LABELS[k] for k in metrics], "vs", *[f"Δ{short[k]}, p" for k in diffs], "s/run"]
    rows = []
    for name, r in s["methods"].items():
        d = r.get("vs_reference")
        rows.append([
            name, point_name(r["chosen"]) if r["chosen"] else "–",
            f"{np.mean(r['val_headline']):.3f}",
            *[format_ci(r["test"][k]) for k in metrics],
            r.get("reference", "–"),
            *([_diff(d[k]) for k in diffs] if d else ["–"] * len(diffs)),
            f"{np.mean(r['wall_seconds']):.0f}"])
    prevalence = (f"prevalence {s['test_prevalence']:.3f}"
                  if isinstance(s["test_prevalence"], float)
                  else f"{s['labels_evaluated']} labels with both classes")
    return (f"Test n = {s['n_test']} ({prevalence}); metrics are the "
            f"mean over seeds {s['seeds']} with 95% bootstrap CIs ({s['n_boot']} resamples of "
            "test stays, each averaging the seeds); Δ is the paired bootstrap difference "
            "against the method in column vs, on the same resamples.\n\n"
            + _md_table(head, rows) + "\n")


def _diff(d: dict[str, Any]) -> str:
    if d["diff"] is None:
        return "n/a"
    return f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}], p = {d['p_value']:.2f}"

