"""Re-evaluate a finished run directory: test metrics, bootstrap CIs and plots, from its files.

Reads `predictions.npz` (written by training.run.train_run), so a run can be re-scored with more
bootstrap replicates without touching data or model. With `recompute=True`, or when the
predictions file is missing, the checkpoint is reloaded and the splits re-read from the data
folder named in its config, which also checks that `model.pt` reproduces the saved predictions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from scehr.schemas.run_artifacts import RunArtifacts, split_key
from scehr.schemas.tasks import task_spec
from scehr.training.bootstrap import bootstrap_metrics
from scehr.training.config import TrainConfig
from scehr.training.metrics import task_metrics
from scehr.training.plots import plot_pr_curves, plot_reliability, plot_roc_curves


def load_run_config(run_dir: Path) -> TrainConfig:
    files = RunArtifacts(run_dir)
    files.require(files.config)
    return TrainConfig(**json.loads(files.config.read_text()))


def load_predictions(run_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """{"val": {...}, "test": {...}, ...}: y, probability, anchor_logits, z, stays per split."""
    with np.load(RunArtifacts(run_dir).predictions) as f:
        out: dict[str, dict[str, np.ndarray]] = {}
        for key in f.files:
            split, name = split_key(key)
            out.setdefault(split, {})[name] = f[key]
    return out


def predictions_from_checkpoint(run_dir: Path, cfg: TrainConfig) -> dict[str, dict[str, Any]]:
    """Re-predict val and test with `model.pt` on the splits the run was trained with."""
    from scehr.training.fit import load_checkpoint, predict, prepare

    model, crit, _ = load_checkpoint(RunArtifacts(run_dir).checkpoint)
    data = prepare(cfg)
    out: dict[str, dict[str, Any]] = {}
    for split in ("val", "test"):
        ts = getattr(data, split)
        out[split] = {**predict(model, crit, ts), "stays": np.array(ts.stays)}
    return out


def _label_names(run_dir: Path, saved: dict[str, Any]) -> list[str] | None:
    per_label = saved.get("test", {}).get("per_label_auroc")
    if per_label:
        return list(per_label)
    if (run_dir / "model.pt").is_file():
        import torch

        return list(torch.load(run_dir / "model.pt", map_location="cpu",
                               weights_only=False)["label_names"])
    return None


def evaluate_run(
    run_dir: Path, n_boot: int = 1000, recompute: bool = False, plots: bool = True,
    seed: int | None = None,
) -> dict[str, Any]:
    """Test (and val) metrics, test CIs with `n_boot` replicates; writes `evaluation.json`."""
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    saved_path = run_dir / "metrics.json"
    saved = json.loads(saved_path.read_text()) if saved_path.is_file() else {}
    have_npz = (run_dir / "predictions.npz").is_file()
    source = "checkpoint" if recompute or not have_npz else "predictions.npz"
    preds = predictions_from_checkpoint(run_dir, cfg) if source == "checkpoint" \
        else load_predictions(run_dir)
    names = _label_names(run_dir, saved)
    test, val = preds["test"], preds["val"]
    out: dict[str, Any] = {
        "run_dir": str(run_dir),
        "task": cfg.task,
        "source": source,
        "val": task_metrics(cfg.task, val["y"], val["probability"], names),
        "test": task_metrics(cfg.task, test["y"], test["probability"], names),
        "test_ci": bootstrap_metrics(cfg.task, test["y"], test["probability"], n_boot=n_boot,
                                     seed=cfg.seed if seed is None else seed),
    }
    if source == "checkpoint" and have_npz:
        old = load_predictions(run_dir)["test"]
        out["max_abs_diff_vs_saved_predictions"] = float(
            np.max(np.abs(old["probability"] - test["probability"])))
        out["same_test_stays"] = bool(np.array_equal(old["stays"], test["stays"]))
    if test["y"].ndim == 1 or test["y"].shape[1] == 1:
        out["challenge2012"] = challenge2012_scores(cfg, preds, n_boot,
                                                    cfg.seed if seed is None else seed)
    headline = out["test"]["headline"]
    if saved:
        out["saved_test_headline"] = saved["test"][headline]
        new, old_v = out["test"][headline], saved["test"][headline]
        out["matches_saved"] = (new is None and old_v is None) or (
            new is not None and old_v is not None and abs(new - old_v) < 1e-9)
    if plots:
        _plots(run_dir, cfg, preds, out["test_ci"])
    from scehr.training.data.writer import write_json

    write_json(run_dir / "evaluation.json", out)
    return out


def served_risk(cfg: TrainConfig, preds: dict[str, dict[str, np.ndarray]]
                ) -> dict[str, Any] | None:
    """The risk the service would show on each split of a run, [N, C] per split ("method":
    class 0's map, "methods": every class's), with each class's calibration map fitted exactly
    as `scehr export` fits it (calibration split, chosen on validation); None when the run has
    no calibration split."""
    from scehr.training.losses import calibration_input
    from scehr.training.serving_assets import fit_calibration

    def column(split: str, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        d = preds[split]
        n = len(d["y"])
        lg = d["anchor_logits"].reshape(n, -1, 2)[:, c]
        return (d["y"].reshape(n, -1)[:, c], d["probability"].reshape(n, -1)[:, c],
                lg[:, 0] - lg[:, 1])

    if "calib" not in preds or not len(preds["calib"]["y"]):
        return None
    kind = calibration_input(cfg.loss)
    n_classes = preds["val"]["probability"].reshape(len(preds["val"]["y"]), -1).shape[1]
    maps = [fit_calibration(column("calib", c), column("val", c), "calibration split", kind)
            for c in range(n_classes)]
    out: dict[str, Any] = {"method": maps[0].method, "methods": [m.method for m in maps]}
    for split in ("val", "test"):
        out[split] = np.stack([m.apply(*column(split, c)[1:]) for c, m in enumerate(maps)],
                              axis=1)
    return out


def reliability_models(cfg: TrainConfig, preds: dict[str, dict[str, np.ndarray]], name: str
                       ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """What calibration.png shows of the test split: first the served risk (each class's map,
    fitted as export fits it), then the model's own probability (the ONNX `score`, not served)
    where a map changes it."""
    test = preds["test"]
    risk = served_risk(cfg, preds)
    if risk is None:
        return {f"{name}: served risk (no calibration split: the model's probability)":
                (test["y"], test["probability"])}
    maps = sorted(set(risk["methods"]))
    out = {f"{name}: served risk ({', '.join(maps)} map)": (test["y"], risk["test"])}
    if maps != ["none"]:
        out[f"{name}: model probability (score; not served)"] = (test["y"], test["probability"])
    return out


def challenge2012_scores(cfg: TrainConfig, preds: dict[str, dict[str, np.ndarray]], n_boot: int,
                         seed: int) -> dict[str, Any]:
    """Challenge 2012 Event 1/2 of a binary run, on the calibrated risk the service would show
    (`served_risk`); the model's uncalibrated probability is scored too, labelled as such."""
    from scehr.training.challenge2012 import challenge_scores

    yv, yt = preds["val"]["y"].reshape(-1), preds["test"]["y"].reshape(-1)
    out: dict[str, Any] = {"uncalibrated_probability": challenge_scores(
        yv, preds["val"]["probability"].reshape(-1), yt,
        preds["test"]["probability"].reshape(-1), n_boot=n_boot, seed=seed)}
    risk = served_risk(cfg, preds)
    if risk is not None:
        out["calibration"] = risk["method"]
        out["risk"] = challenge_scores(yv, risk["val"][:, 0], yt, risk["test"][:, 0],
                                       n_boot=n_boot, seed=seed)
    return out


def _plots(run_dir: Path, cfg: TrainConfig, preds: dict[str, dict[str, np.ndarray]],
           ci: dict[str, Any]) -> None:
    test = preds["test"]
    name = f"{cfg.encoder}+{cfg.loss}" + (f"+SCR(λ={cfg.lam:g})" if cfg.lam else "")
    models = {name: (test["y"], test["probability"])}
    roc_key = task_spec(cfg.task).headline_metric
    plot_roc_curves(run_dir / "roc.png", models, cis={name: ci[roc_key]},
                    title=f"{cfg.task}: test ROC")
    plot_pr_curves(run_dir / "pr.png", models, cis={name: ci["auprc"]} if "auprc" in ci
                   else None, title=f"{cfg.task}: test precision-recall")
    plot_reliability(run_dir / "calibration.png", reliability_models(cfg, preds, name),
                     title=f"{cfg.task}: reliability of the test split")
