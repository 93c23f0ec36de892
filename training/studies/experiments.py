"""Studies built from many runs: hyper-parameter grid, class-imbalance sweep, embedding quality,
and the acceptance comparison (CBCE+SCR vs BCE vs logistic regression, paired bootstrap).

Every study is resumable: a run whose `metrics.json` exists is read back instead of retrained
(`metrics.json` is the last file train_run writes before plots, so a killed run is redone).
Selection always uses validation metrics; test metrics are reported, never used to choose.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import shlex
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scehr.schemas.tasks import task_spec
from scehr.training.bootstrap import (
    bootstrap_metrics,
    format_ci,
    format_mean_sd,
    mean_sd,
    paired_bootstrap_diff,
)
from scehr.training.config import TrainConfig
from scehr.training.data.writer import write_json
from scehr.training.fit import Prepared, prepare
from scehr.training.metrics import auprc, auroc, headline_metric, macro_auroc, micro_auroc
from scehr.training.progress import Progress
from scehr.training.run import train_run

MetricFn = Callable[[np.ndarray, np.ndarray], float]


# ---------------------------------------------------------------- shared plumbing
class DataCache:
    """One `prepare()` per distinct data setting; combos differing only in loss/λ/batch share it.

    The key holds every config field prepare() reads (the seed drives the calibration hold-out
    and any down-sampling). Only `max_items` results are kept (a real dataset's tensors take
    hundreds of MB), so studies loop over data settings outermost.
    """

    def __init__(self, max_items: int = 1) -> None:
        self._cache: dict[tuple[Any, ...], Prepared] = {}
        self.max_items, self.loads = max_items, 0

    @staticmethod
    def key(cfg: TrainConfig) -> tuple[Any, ...]:
        return (str(cfg.data), cfg.task, cfg.train_prevalence, cfg.max_train_stays,
                getattr(cfg, "calibration_fraction", None), cfg.seed)

    def get(self, cfg: TrainConfig) -> Prepared:
        k = self.key(cfg)
        if k not in self._cache:
            while len(self._cache) >= self.max_items:
                self._cache.pop(next(iter(self._cache)))
            self._cache[k] = prepare(cfg)
            self.loads += 1
        return self._cache[k]


#: Settings that do not change what a run computes; a resumed run may differ in them.
_RESUME_IGNORED = frozenset({"progress", "threads"})


def ensure_run(cfg: TrainConfig, cache: DataCache,
               echo: bool = True) -> tuple[dict[str, Any], bool]:
    """(metrics, trained_now): read `<out>/metrics.json` if present, else train the run.

    A finished run trained with other settings is an error, not silently reused. `echo=False`
    keeps the run's per-epoch lines in its train.log only.
    """
    out = Path(cfg.out)
    path = out / "metrics.json"
    if path.is_file():
        saved = json.loads((out / "config.json").read_text())
        new = json.loads(json.dumps(cfg.to_dict()))  # the same JSON round trip as config.json
        # A key the saved config lacks (written before the key existed) had its default value.
        default = json.loads(json.dumps(dataclasses.asdict(TrainConfig(task=cfg.task))))
        differ = sorted(k for k in new.keys() - _RESUME_IGNORED
                        if saved.get(k, default[k]) != new[k])
        if differ:
            raise ValueError(f"{out} holds a finished run with different settings {differ}; "
                             "use a new folder or delete that run")
        return json.loads(path.read_text()), False
    return train_run(cfg, cache.get(cfg), echo=echo), True


def timed_run(cfg: TrainConfig, cache: DataCache, progress: Progress,
              what: str) -> tuple[dict[str, Any], bool]:
    """ensure_run, then one '[k/N] what: val ... (s); ETA' line."""
    t0 = time.perf_counter()
    m, trained = ensure_run(cfg, cache, echo=False)
    headline = m["val"]["headline"]
    v = m["val"][headline]
    print(progress.step(f"{what}: val {headline} {'n/a' if v is None else f'{v:.4f}'}",
                        time.perf_counter() - t0, trained), flush=True)
    return m, trained


def _variant(base: TrainConfig, out: Path, **changes: Any) -> TrainConfig:
    return dataclasses.replace(base, out=str(out), encoder_hparams=dict(base.encoder_hparams),
                               loss_params=dict(base.loss_params), **changes)


def _md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _f(v: float | None, digits: int = 3) -> str:
    return "n/a" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.{digits}f}"


# ---------------------------------------------------------------- grid
def combo_name(loss: str, batch_size: int, lam: float, seed: int) -> str:
    return f"{loss}-bs{batch_size}-lam{lam:g}-s{seed}"


def run_grid(
    base_cfg: TrainConfig,
    grid_dir: Path,
    batch_sizes: Sequence[int],
    lams: Sequence[float],
    losses: Sequence[str],
    seeds: Sequence[int],
) -> dict[str, Any]:
    """Train every (loss, batch size, λ, seed) into `grid_dir/<combo>/`; pick a config on val.

    Writes `summary.csv` (one row per run), `summary.md` (per-config mean ± sd over seeds and
    the per-run table) and `best.json` (the config with the best mean validation headline).
    """
    grid_dir = Path(grid_dir)
    grid_dir.mkdir(parents=True, exist_ok=True)
    headline = headline_metric(base_cfg.task)
    cache, rows = DataCache(), []
    progress = Progress(len(seeds) * len(losses) * len(batch_sizes) * len(lams))
    for seed in seeds:  # outermost: the prepared data depends on the seed only
        for loss in losses:
            for bs in batch_sizes:
                for lam in lams:
                    name = combo_name(loss, bs, lam, seed)
                    cfg = _variant(base_cfg, grid_dir / name, loss=loss, batch_size=bs,
                                   lam=float(lam), seed=seed)
                    m, trained = timed_run(cfg, cache, progress, name)
                    ci = m["test_ci"][headline]
                    rows.append({
                        "combo": name, "loss": loss, "batch_size": bs, "lam": float(lam),
                        "seed": seed, f"val_{headline}": m["val"][headline],
                        f"test_{headline}": ci["value"], f"test_{headline}_low": ci["low"],
                        f"test_{headline}_high": ci["high"], "best_epoch": m["best_epoch"],
                        "epochs_run": m["epochs_run"], "train_seconds": m["train_seconds"],
                        "trained_now": trained,
                    })
    _write_csv(grid_dir / "summary.csv", rows)
    configs = _group(rows, ("loss", "batch_size", "lam"), headline)
    best = max(configs, key=lambda c: c["val_mean"])  # first in grid order on ties
    best_cfg = _variant(base_cfg, Path(""), loss=best["loss"], batch_size=best["batch_size"],
                        lam=best["lam"]).to_dict()
    best_cfg.pop("out")
    best_cfg.pop("seed")
    chosen = {**{k: best[k] for k in ("loss", "batch_size", "lam")},
              "selected_on": f"mean validation {headline} over seeds {list(seeds)}",
              f"val_{headline}": best["val"], f"test_{headline}": best["test"],
              "runs": best["runs"], "config": best_cfg}
    write_json(grid_dir / "best.json", chosen)
    _grid_markdown(grid_dir, base_cfg, headline, configs, rows, best)
    return {"runs": rows, "configs": configs, "best": chosen, "data_loads": cache.loads}


def _group(rows: list[dict[str, Any]], keys: Sequence[str], headline: str) -> list[dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for k, rs in groups.items():
        val = [r[f"val_{headline}"] for r in rs if r[f"val_{headline}"] is not None]
        test = [r[f"test_{headline}"] for r in rs if r[f"test_{headline}"] is not None]
        out.append({**dict(zip(keys, k, strict=True)),
                    "val": mean_sd(val) if val else None, "test": mean_sd(test) if test else None,
                    "val_mean": float(np.mean(val)) if val else -np.inf,
                    "runs": [r["combo"] for r in rs]})
    return out


def _grid_markdown(grid_dir: Path, base: TrainConfig, headline: str,
                   configs: list[dict[str, Any]], rows: list[dict[str, Any]],
                   best: dict[str, Any]) -> None:
    def ms(s: dict[str, Any] | None) -> str:
        return "n/a" if s is None else f"{s['mean']:.3f} ± {s['sd']:.3f} (n={s['n']})"

    cfg_rows = [[c["loss"], c["batch_size"], f"{c['lam']:g}", ms(c["val"]), ms(c["test"]),
                 "**chosen**" if c is best else ""] for c in configs]
    run_rows = [[r["combo"], _f(r[f"val_{headline}"]),
                 format_ci({"value": r[f"test_{headline}"], "low": r[f"test_{headline}_low"],
                            "high": r[f"test_{headline}_high"]}),
                 r["best_epoch"], r["epochs_run"], f"{r['train_seconds']:.1f}"] for r in rows]
    text = "\n\n".join([
        f"# Grid: {base.task}, encoder {base.encoder}, data `{base.data}`",
        f"Selection: highest mean validation {headline} over seeds (test never used to choose).",
        "## Per configuration (mean ± sd over seeds)",
        _md_table(["loss", "batch", "λ", f"val {headline}", f"test {headline}", ""], cfg_rows),
        "## Per run (test with 95% bootstrap CI)",
        _md_table(["run", f"val {headline}", f"test {headline} [95% CI]", "best epoch",
                   "epochs", "train s"], run_rows),
    ])
    (grid_dir / "summary.md").write_text(text + "\n")


# ---------------------------------------------------------------- imbalance
def parse_loss_spec(spec: str, default_lam: float) -> tuple[str, float, str]:
    """'cbce' (λ from the base config) or 'cbce@0.007' -> (loss, λ, label)."""
    loss, _, lam_s = spec.partition("@")
    lam = float(lam_s) if lam_s else default_lam
    label = loss + (f"+SCR(λ={lam:g})" if lam else "")
    return loss, lam, label


def run_imbalance(
    base_cfg: TrainConfig,
    study_dir: Path,
    prevalences: Sequence[float],
    seeds: Sequence[int],
    losses: Sequence[str],
) -> dict[str, Any]:
    """Down-sample training positives to each prevalence; validation and test stay unchanged.

    `losses` entries are 'name' or 'name@λ' (see parse_loss_spec). Writes `imbalance.csv`
    (one row per run), `imbalance.md` (test AUROC/AUPRC mean ± sd per loss and prevalence) and
    `imbalance.png` (test AUROC vs training prevalence, log x axis, ±sd error bars).
    """
    if not task_spec(base_cfg.task).binary:
        raise ValueError("the imbalance study down-samples a binary task (e.g. mortality)")
    study_dir = Path(study_dir)
    study_dir.mkdir(parents=True, exist_ok=True)
    cache, rows = DataCache(), []
    progress = Progress(len(prevalences) * len(seeds) * len(losses))
    for prev in prevalences:  # data settings outermost, so each is prepared once
        for seed in seeds:
            for spec in losses:
                loss, lam, label = parse_loss_spec(spec, base_cfg.lam)
                out = study_dir / f"{loss}-lam{lam:g}-p{prev:g}-s{seed}"
                cfg = _variant(base_cfg, out, loss=loss, lam=lam, seed=seed,
                               train_prevalence=float(prev))
                m, trained = timed_run(cfg, cache, progress, out.name)
                rows.append({"model": label, "loss": loss, "lam": lam, "target_prevalence": prev,
                             "train_prevalence": m["train_prevalence"][0],
                             "n_train": m["n"]["train"], "seed": seed,
                             "val_auroc": m["val"]["auroc"], "test_auroc": m["test"]["auroc"],
                             "test_auprc": m["test"]["auprc"], "best_epoch": m["best_epoch"],
                             "trained_now": trained})
    _write_csv(study_dir / "imbalance.csv", rows)
    table = _imbalance_table(rows)
    text = "\n\n".join([
        f"# Class-imbalance study: {base_cfg.task}, data `{base_cfg.data}`",
        "Training positives down-sampled to the target prevalence; validation (early stopping) "
        f"and test sets unchanged. Seeds {list(seeds)}; mean ± sd over seeds.",
        _md_table(["model", "target prevalence", "actual train prevalence", "n train",
                   "test AUROC", "test AUPRC"],
                  [[t["model"], f"{t['target_prevalence']:g}", f"{t['train_prevalence']:.4f}",
                    t["n_train"], t["auroc"], t["auprc"]] for t in table]),
        "![test AUROC vs training prevalence](imbalance.png)",
    ])
    (study_dir / "imbalance.md").write_text(text + "\n")
    plot_imbalance(study_dir / "imbalance.png", rows)
    return {"runs": rows, "table": table}


def _imbalance_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["target_prevalence"]), []).append(r)
    out = []
    for (model, prev), rs in groups.items():
        au = [r["test_auroc"] for r in rs if r["test_auroc"] is not None]
        ap = [r["test_auprc"] for r in rs if r["test_auprc"] is not None]
        out.append({"model": model, "target_prevalence": prev,
                    "train_prevalence": float(np.mean([r["train_prevalence"] for r in rs])),
                    "n_train": int(np.mean([r["n_train"] for r in rs])),
                    "auroc": format_mean_sd(au) if au else "n/a",
                    "auprc": format_mean_sd(ap) if ap else "n/a"})
    order = list(dict.fromkeys(r["model"] for r in rows))
    return sorted(out, key=lambda t: (order.index(t["model"]), -t["target_prevalence"]))


def plot_imbalance(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Test AUROC (mean ± sd over seeds) against the training prevalence, one line per model."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    fig = Figure(figsize=(6.5, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for model in dict.fromkeys(r["model"] for r in rows):
        prevs = sorted({r["target_prevalence"] for r in rows if r["model"] == model})
        stats = [mean_sd([r["test_auroc"] for r in rows if r["model"] == model
                          and r["target_prevalence"] == p and r["test_auroc"] is not None]
                         or [np.nan]) for p in prevs]
        ax.errorbar(prevs, [s["mean"] for s in stats], yerr=[s["sd"] for s in stats],
                    marker="o", capsize=4, lw=1.5, label=model)
    ax.set_xscale("log")
    ticks = sorted({r["target_prevalence"] for r in rows})
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel="training prevalence of positives (log scale)", ylabel="test AUROC",
           title="Test AUROC vs training class imbalance (mean ± sd over seeds)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)
    return path


# ---------------------------------------------------------------- embeddings
def embedding_study(run_dir: Path, label: int = 0, max_points: int = 2000) -> dict[str, Any]:
    """Separation, intra-class spread and linear-probe AUROC of test embeddings, plus a t-SNE
    with the anchors of class `label`; writes `embedding.json` and `embedding_tsne.png`.

    The probe is fitted on the training embeddings saved in `predictions.npz` (recomputed from
    the checkpoint and data when an older run lacks them) and scored on test.
    """
    from scehr.training.evaluate import load_predictions, load_run_config
    from scehr.training.fit import load_checkpoint, predict
    from scehr.training.plots import plot_embedding_tsne
    from scehr.training.studies.embedding_quality import (
        embedding_quality,
        embedding_quality_multilabel,
    )

    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    preds = load_predictions(run_dir)
    model, crit, ck = load_checkpoint(run_dir / "model.pt")
    names = list(ck["label_names"])
    if not 0 <= label < len(names):
        raise ValueError(f"--label {label} is out of range: the run has {len(names)} "
                         f"label(s), 0 to {len(names) - 1}")
    train = preds.get("train")
    if train is None or "z" not in train:
        train = predict(model, crit, prepare(cfg).train)
    test = preds["test"]
    spec = task_spec(cfg.task)
    if spec.binary:
        report = embedding_quality(train["z"], train["y"][:, 0], test["z"], test["y"][:, 0])
    else:
        report = embedding_quality_multilabel(train["z"], train["y"], test["z"], test["y"], names)
    u, v = model.head.anchors()
    cls = dict(enumerate(spec.outcomes(names[label])))
    plot_embedding_tsne(run_dir / "embedding_tsne.png", test["z"], test["y"][:, label],
                        anchors={"u (positive)": u[label].numpy(),
                                 "v (negative)": v[label].numpy()},
                        class_names=cls, max_points=max_points, seed=cfg.seed,
                        title=f"{cfg.task}: test embeddings with the anchors of {names[label]}")
    out = {"run_dir": str(run_dir), "split": "test", "probe_fitted_on": "train",
           "n_train": len(train["z"]), "n_test": len(test["z"]), "tsne_label": names[label],
           **report}
    write_json(run_dir / "embedding.json", out)
    return out


# ---------------------------------------------------------------- acceptance comparison
def _metric_fns(task: str, y: np.ndarray) -> tuple[dict[str, MetricFn], np.ndarray]:
    """The two reported metrics and the label columns they use (as bootstrap_metrics does)."""
    if headline_metric(task) == "auroc":
        return {"auroc": auroc, "auprc": auprc}, np.ones(y.shape[1], dtype=bool)
    keep = y.min(axis=0) != y.max(axis=0)
    return {"micro_auroc": micro_auroc,
            "macro_auroc": lambda a, b: macro_auroc(a, b, strict=True)}, keep


def _lstm_predictions(run_dir: Path) -> dict[str, np.ndarray]:
    with np.load(run_dir / "predictions.npz") as f:
        return {k: f[f"test_{k}"] for k in ("y", "probability", "stays")}


def run_comparison(
    cfg: TrainConfig,
    study_dir: Path,
    lam: float = 0.007,
    seeds: Sequence[int] = (0,),
    docs: Path | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """CBCE+SCR (λ = lam) vs BCE (λ = 0) LSTMs, same config otherwise, vs logistic regression.

    Per seed: test metrics with 95% bootstrap CIs, the paired bootstrap differences
    (CBCE+SCR − BCE, and best-on-validation LSTM − LR) with p-values on the same test stays,
    and wall times. Writes `comparison.json`, `comparison.md`, `comparison_roc.png`,
    `comparison_pr.png` under `study_dir` and, if `docs` is given (a `.md` file or a folder),
    the same markdown with the PNGs copied next to it. Returns the comparison dict.
    """
    from scehr.training.plots import plot_pr_curves, plot_roc_curves
    from scehr.training.studies.baseline import baseline_predictions, fit_logistic_baseline

    if not seeds:
        raise ValueError("run_comparison needs at least one seed")
    study_dir = Path(study_dir)
    study_dir.mkdir(parents=True, exist_ok=True)
    cache = DataCache()
    names = {"scr": f"{cfg.encoder} CBCE+SCR (λ={lam:g})", "bce": f"{cfg.encoder} BCE",
             "lr": "logistic regression"}
    seeds_out: list[dict[str, Any]] = []
    progress = Progress(2 * len(seeds))
    lr_pred: dict[str, np.ndarray] = {}
    lr_info: dict[str, Any] = {}
    for seed in seeds:
        runs = {"scr": _variant(cfg, study_dir / f"cbce-scr-lam{lam:g}-s{seed}", loss="cbce",
                                lam=float(lam), seed=seed),
                "bce": _variant(cfg, study_dir / f"bce-s{seed}", loss="bce", lam=0.0, seed=seed)}
        metrics = {k: {**timed_run(c, cache, progress, Path(c.out).name)[0], "_run_dir": c.out}
                   for k, c in runs.items()}
        preds = {k: _lstm_predictions(Path(c.out)) for k, c in runs.items()}
        if not lr_pred:  # deterministic; fitted once, on the first seed's training split
            data = cache.get(runs["scr"])
            model = fit_logistic_baseline(data.raw["train"], data.raw["val"], cfg.task)
            t0 = time.perf_counter()
            lr_pred = {**baseline_predictions(model, data.raw["test"]),
                       "stays": np.asarray(data.raw["test"].stays)}
            lr_info = {**model.summary(),
                       "wall_seconds": model.fit_seconds + time.perf_counter() - t0,
                       "n_train": len(data.raw["train"])}
            np.savez_compressed(study_dir / "logreg_predictions.npz", **lr_pred)
        preds["lr"] = lr_pred
        seeds_out.append(_compare_seed(cfg, seed, names, metrics, preds, lr_info))
    result = {"task": cfg.task, "data": cfg.data, "lam": lam, "seeds": list(seeds),
              "n_boot": cfg.n_boot, "models": names, "per_seed": seeds_out,
              "over_seeds": _over_seeds(seeds_out, names) if len(seeds) > 1 else None,
              "logistic_regression": lr_info, "shared_config": _shared_config(cfg),
              "command": command or comparison_command(cfg, study_dir, lam, seeds, docs)}
    first = seeds_out[0]
    models = {names[k]: (lr_pred["y"], p) for k, p in first["_probs"].items()}
    key_roc = next(iter(first["models"][names["scr"]]["test_ci"]))
    plot_roc_curves(study_dir / "comparison_roc.png", models,
                    cis={n: m["test_ci"][key_roc] for n, m in first["models"].items()},
                    title=f"{cfg.task}: test ROC (seed {first['seed']})")
    plot_pr_curves(study_dir / "comparison_pr.png", models,
                   cis={n: m["test_ci"]["auprc"] for n, m in first["models"].items()}
                   if key_roc == "auroc" else None,
                   title=f"{cfg.task}: test precision-recall (seed {first['seed']})")
    for s in seeds_out:
        s.pop("_probs")
    write_json(study_dir / "comparison.json", result)
    text = comparison_markdown(result)
    (study_dir / "comparison.md").write_text(text)
    print(text)
    if docs is not None:
        _write_docs(Path(docs), study_dir, text)
    return result


def _compare_seed(cfg: TrainConfig, seed: int, names: dict[str, str],
                  metrics: dict[str, dict[str, Any]], preds: dict[str, dict[str, np.ndarray]],
                  lr_info: dict[str, Any]) -> dict[str, Any]:
    ref = preds["lr"]
    for k in ("scr", "bce"):  # the paired bootstrap needs the very same stays in the same order
        if not np.array_equal(preds[k]["stays"], ref["stays"]):
            raise AssertionError(f"test stay order of the {k} run differs from the baseline's")
        if not np.array_equal(preds[k]["y"], ref["y"]):
            raise AssertionError(f"test labels of the {k} run differ from the baseline's")
    y = np.asarray(ref["y"])
    fns, keep = _metric_fns(cfg.task, y)
    yk = y[:, keep]
    probs = {k: np.asarray(p["probability"]) for k, p in preds.items()}

    def ci(p: np.ndarray) -> dict[str, Any]:
        return bootstrap_metrics(cfg.task, y, p, n_boot=cfg.n_boot, seed=seed)

    models = {}
    for k in ("scr", "bce"):
        m = metrics[k]
        models[names[k]] = {"test_ci": ci(probs[k]), "val": m["val"][m["val"]["headline"]],
                            "best_epoch": m["best_epoch"], "wall_seconds": m["wall_seconds"],
                            "train_seconds": m["train_seconds"], "run_dir": m["_run_dir"]}
    models[names["lr"]] = {"test_ci": ci(probs["lr"]),
                           "val": lr_info["val_scores"][str(lr_info["C"])], "best_epoch": None,
        "wall_seconds": lr_info["wall_seconds"], "train_seconds": lr_info["fit_seconds"]}
    best = max(("scr", "bce"), key=lambda k: models[names[k]]["val"] or -np.inf)

    def diff(a: str, b: str) -> dict[str, Any]:
        return {metric: paired_bootstrap_diff(fn, yk, probs[a][:, keep], probs[b][:, keep],
                                              n_boot=cfg.n_boot, seed=seed)
                for metric, fn in fns.items()}

    diffs = {f"{names['scr']} − {names['bce']}": diff("scr", "bce"),
             f"best LSTM on val ({names[best]}) − {names['lr']}": diff(best, "lr")}
    return {"seed": seed, "models": models, "paired_diffs": diffs, "best_lstm": names[best],
            "n_test": len(y), "test_prevalence": y.mean(axis=0).tolist(), "_probs": probs}


def _over_seeds(seeds_out: list[dict[str, Any]], names: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names.values():
        per = [s["models"][name]["test_ci"] for s in seeds_out]
        out[name] = {metric: mean_sd([p[metric]["value"] for p in per
                                      if p[metric]["value"] is not None] or [np.nan])
                     for metric in per[0]}
    return out


def _shared_config(cfg: TrainConfig) -> dict[str, Any]:
    """What both LSTMs share (everything but loss, λ, seed and output folder)."""
    d = cfg.to_dict()
    for k in ("out", "loss", "lam", "seed", "progress"):
        d.pop(k, None)
    return d


def comparison_command(cfg: TrainConfig, study_dir: Path, lam: float, seeds: Sequence[int],
                       docs: Path | None) -> str:
    """An equivalent `scehr compare` command line with every relevant option explicit."""
    args = ["scehr", "compare", "--task", cfg.task, "--data", str(cfg.data),
            "--encoder", cfg.encoder, "--batch-size", str(cfg.batch_size), "--lr", f"{cfg.lr:g}",
            "--epochs", str(cfg.epochs), "--patience", str(cfg.patience),
            "--threads", str(cfg.threads), "--n-boot", str(cfg.n_boot)]
    if cfg.max_train_stays is not None:
        args += ["--max-train-stays", str(cfg.max_train_stays)]
    args += ["--scr-lam", f"{lam:g}", "--seeds", *map(str, seeds), str(study_dir)]
    if docs is not None:
        args += ["--docs", str(docs)]
    return shlex.join(args)


def comparison_markdown(r: dict[str, Any], png_prefix: str = "comparison_") -> str:
    """The comparison as markdown: numbers only (commentary is written by a person)."""
    parts = [f"# {r['task']}: CBCE+SCR vs BCE vs logistic regression",
             f"Data: `{r['data']}`. Test metrics with 95% percentile bootstrap CIs "
             f"({r['n_boot']} replicates over test stays); paired differences resample the "
             "same stays for both models; p is two-sided.",
             f"Command:\n\n```\n{r['command']}\n```",
             "Shared LSTM settings: " + ", ".join(
                 f"{k} = {v}" for k, v in r["shared_config"].items()
                 if k in ("encoder", "encoder_hparams", "batch_size", "lr", "epochs", "patience",
                          "temperature", "max_train_stays", "calibration_fraction", "threads")
             ) + ". Wall s: training + prediction + evaluation of each model (data loading, "
             "shared by all three, excluded); the LSTM runs are read back from their run "
             "folders when they already exist."]
    for s in r["per_seed"]:
        metrics = list(next(iter(s["models"].values()))["test_ci"])
        rows = [[name, *[format_ci(m["test_ci"][k]) for k in metrics], _f(m["val"]),
                 m["best_epoch"] if m["best_epoch"] is not None else "–",
                 f"{m['wall_seconds']:.1f}"] for name, m in s["models"].items()]
        parts.append(f"## Seed {s['seed']} (n test = {s['n_test']})")
        parts.append(_md_table(["model", *[f"test {k} [95% CI]" for k in metrics],
                                "val headline", "best epoch", "wall s"], rows))
        drows = [[comp, k, format_ci({"value": d["diff"], "low": d["low"], "high": d["high"]},
                                     digits=4), _f(d["p_value"], 4)]
                 for comp, ds in s["paired_diffs"].items() for k, d in ds.items()]
        parts.append(_md_table(["paired difference", "metric", "diff [95% CI]", "p"], drows))
    if r.get("over_seeds"):
        parts.append(f"## Mean ± sd over seeds {r['seeds']}")
        metrics = list(next(iter(r["over_seeds"].values())))
        parts.append(_md_table(["model", *[f"test {k}" for k in metrics]], [
            [name, *[f"{v[k]['mean']:.3f} ± {v[k]['sd']:.3f}" for k in metrics]]
            for name, v in r["over_seeds"].items()]))
    lr = r["logistic_regression"]
    parts.append(f"Logistic regression: C = {lr['C']:g} chosen on validation from "
                 f"{sorted(float(c) for c in lr['val_scores'])}, {lr['n_features']} summary "
                 f"features, fitted on {lr['n_train']} training stays.")
    parts.append(f"![ROC]({png_prefix}roc.png) ![PR]({png_prefix}pr.png)")
    return "\n\n".join(parts) + "\n"


def _write_docs(docs: Path, study_dir: Path, text: str) -> Path:
    md = docs if docs.suffix == ".md" else docs / f"{study_dir.name}.md"
    md.parent.mkdir(parents=True, exist_ok=True)
    prefix = f"{md.stem}_"
    for kind in ("roc", "pr"):
        shutil.copyfile(study_dir / f"comparison_{kind}.png", md.parent / f"{prefix}{kind}.png")
    md.write_text(text.replace("](comparison_", f"]({prefix}"))
    return md
